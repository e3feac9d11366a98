"""The interface of a client of a PS's TicTac gate, shared by both backends: the proxy's
:class:`~tictac_hooks.enforce.client.RendezvousClient` and the native
:class:`~tictac_hooks.enforce.native.client.NativeClient`;
:func:`~tictac_hooks.enforce.client.connect` picks one. Every client, the in-process one
included, is held to this contract by one scenario (tests/enforce/test_client_contract.py)."""

from __future__ import annotations

import json
from typing import Any

from tictac_hooks.enforce.gate import DEFAULT_SKIP_AFTER_S, InstallResult
from tictac_hooks.graph.schedule import Schedule, ScheduleError
from tictac_hooks.records import GateStats

BACKENDS = ("native", "proxy")

# The skip bound's one default (defined beside the gate; re-exported here).
__all__ = ["BACKENDS", "DEFAULT_SKIP_AFTER_S", "INSTALL_SETTINGS", "MAX_INSTALL_BYTES",
           "GateClient", "GateError", "UnhonouredSetting", "check_install_size",
           "check_schedule_size"]

# The settings an install takes beside the schedule (GateClient.install's keywords); a
# backend that cannot honour one says why in its client's ``unhonoured``.
INSTALL_SETTINGS = ("skip_after_s", "window_bytes", "pace_rate", "align")

# The largest install request a client sends, on either backend (the proxy's control
# service accepts requests up to this size; gRPC's own default is 4 MiB). 64 MiB holds
# 100,000 transfers (as many served names as a gate remembers) with names of about 300
# characters; a bigger request would only cost the PS memory.
MAX_INSTALL_BYTES = 64 << 20


def check_install_size(schedule: Schedule, nbytes: int, address: str) -> None:
    """Raises ScheduleError, before anything is sent, for an install request over
    :data:`MAX_INSTALL_BYTES`."""
    if nbytes > MAX_INSTALL_BYTES:
        raise ScheduleError(
            f"the schedule for {address} is too large to install: {len(schedule)} transfers "
            f"encode to {nbytes / (1 << 20):.1f} MiB, over the limit of "
            f"{MAX_INSTALL_BYTES >> 20} MiB per install; schedule fewer transfers (only "
            "those the PS serves) or use shorter names")


def check_schedule_size(schedule: Schedule, address: str) -> None:
    """:func:`check_install_size` for a schedule sent as its JSON (the in-process
    client's install, and install_plan's check before any PS is touched)."""
    check_install_size(schedule, len(json.dumps(schedule.to_json()).encode()), address)


class GateError(ConnectionError):
    """A PS's TicTac gate could not be reached, or refused a request (both backends)."""


class UnhonouredSetting(ValueError):
    """An install setting given to a backend that cannot honour it (GateClient.unhonoured)."""


class GateClient:
    """What every backend's client offers: ``ping``, ``install`` (a schedule; steps
    starting after it run under it), ``clear``, ``stats`` (totals plus one record per
    step and worker; with ``since``, a cursor's read: only the records finished after
    record number ``since``, with ``last_seq`` and ``dropped``, see
    :meth:`tictac_hooks.enforce.gate.Gate.read`), ``served_names`` (what a schedule can
    name), ``close``.

    ``unhonoured`` maps each install setting the backend cannot honour to why; its
    ``install`` refuses a value for one (:meth:`refuse_unhonoured`, UnhonouredSetting)
    rather than ignore it, and None leaves it to the backend's own behaviour."""

    address: str
    backend: str
    unhonoured: "dict[str, str]" = {}

    def refuse_unhonoured(self, **settings: Any) -> None:
        """Raises UnhonouredSetting for a setting given (not None) that this backend
        cannot honour, naming the backend, the setting and why."""
        for name, value in settings.items():
            why = self.unhonoured.get(name)
            if value is not None and why is not None:
                raise UnhonouredSetting(
                    f"the {self.backend} backend (the PS at {self.address}) cannot honour "
                    f"{name}={value!r}: {why}; leave it None")

    def ping(self) -> bool: ...
    def install(self, schedule: Schedule, skip_after_s: float | None = None,
                window_bytes: int | None = None,
                pace_rate: float | None = None, align: bool | None = None) -> InstallResult: ...
    def clear(self) -> int: ...
    def stats(self, include_active: bool = True,
              since: int | None = None) -> GateStats: ...
    def served_names(self) -> list[str]: ...
    def close(self) -> None: ...

    def __enter__(self) -> "GateClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
