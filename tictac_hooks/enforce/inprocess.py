"""A gate in this process behind the client interface: the frontends' tests and
simulations talk to it exactly as they talk to a PS.

``with serve_in_process("127.0.0.1:50001", Gate()) as gate:`` makes
:func:`tictac_hooks.enforce.client.connect` answer for that address with an
:class:`InProcessClient` of ``gate`` (the Python gate, or anything with its methods),
so TicTac, TicTacLoop and TicTacHook run their whole control path (ping, clear, install,
stats, the order check's reinstalls) with no PS process and no network. What a worker
would do, request transfers, the caller does on the gate itself, holding
:func:`gate_lock` (TicTac reads records on a thread of its own).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, Iterator

from tictac_hooks import checks
from tictac_hooks.enforce.api import GateClient, GateError, check_schedule_size
from tictac_hooks.enforce.gate import Gate, InstallResult
from tictac_hooks.records import GateStats
from tictac_hooks.graph.schedule import Schedule

_SERVED: dict[str, Gate] = {}
_GATE_LOCKS: dict[str, threading.RLock] = {}
_CALLS: "dict[str, collections.Counter[str]]" = {}
_LOCK = threading.Lock()


@contextlib.contextmanager
def serve_in_process(address: str, gate: Gate) -> Iterator[Gate]:
    """While inside, ``connect(address)`` reaches ``gate`` in this process."""
    checks.address("address", address)
    with _LOCK:
        if address in _SERVED:
            raise ValueError(f"{address} is already served in this process")
        _SERVED[address] = gate
        _GATE_LOCKS[address] = threading.RLock()
        _CALLS[address] = collections.Counter()
    try:
        yield gate
    finally:
        with _LOCK:
            _SERVED.pop(address, None)
            _GATE_LOCKS.pop(address, None)


def gate_lock(address: str) -> "threading.RLock":
    """The lock of the gate served at ``address``: the control calls of its clients
    hold it (they may come from TicTac's reading thread), and so must whoever drives
    the gate's transfer path, as a PS's event loop serializes both."""
    with _LOCK:
        lock = _GATE_LOCKS.get(address)
    if lock is None:
        raise ValueError(f"{address} is not served in this process (serve_in_process)")
    return lock


def lookup(address: str) -> Gate | None:
    with _LOCK:
        return _SERVED.get(address)


def calls(address: str) -> "collections.Counter[str]":
    """How often each control verb reached the gate served at ``address`` (ping,
    install, clear, stats, served), over every client of it."""
    with _LOCK:
        return collections.Counter(_CALLS.get(address, ()))


class InProcessClient(GateClient):
    """The client interface over a gate in this process (what the control services of
    both backends do, as plain calls)."""

    backend = "inprocess"
    unhonoured = {
        "pace_rate": "the Python gate paces by its window of bytes in flight, not at a "
                     "link rate",
        "align": "the Python gate does not pace at a link rate, so it has no link to "
                 "share among the workers of a step",
    }

    def __init__(self, address: str, gate: Gate) -> None:
        self.address = address
        self._gate = gate

    @property
    def gate(self) -> Gate:
        """The gate served at the address now: as over the network, a PS restarted
        in place answers with its new gate; one that is gone does not answer."""
        gate = lookup(self.address)
        if gate is None:
            raise GateError(f"no TicTac gate answers at {self.address} (in this process)")
        return gate

    def _count(self, verb: str) -> None:
        with _LOCK:
            if self.address in _CALLS:
                _CALLS[self.address][verb] += 1

    def _held(self) -> "threading.RLock":
        """The served gate's lock; a gate that is gone does not answer (GateError), as
        over the network."""
        try:
            return gate_lock(self.address)
        except ValueError:
            raise GateError(f"no TicTac gate answers at {self.address} (in this "
                            "process)") from None

    def ping(self) -> bool:
        self._count("ping")
        self.gate  # noqa: B018 - raises GateError where no gate is served any more
        return True

    def install(self, schedule: Schedule, skip_after_s: float | None = None,
                window_bytes: int | None = None,
                pace_rate: float | None = None, align: bool | None = None) -> InstallResult:
        self.refuse_unhonoured(pace_rate=pace_rate, align=align)
        check_schedule_size(schedule, self.address)  # the same limit as over the network
        self._count("install")
        with self._held():
            return self.gate.install(schedule, skip_after_s, window_bytes)

    def clear(self) -> int:
        self._count("clear")
        with self._held():
            return self.gate.clear()

    def stats(self, include_active: bool = True, since: int | None = None) -> GateStats:
        self._count("stats")
        with self._held():
            return self.gate.stats(include_active, since, ps=self.address,
                                   backend=self.backend)

    def served_names(self) -> list[str]:
        self._count("served")
        with self._held():
            return self.gate.served_names()

    def close(self) -> None:
        pass
