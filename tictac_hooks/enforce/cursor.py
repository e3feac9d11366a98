"""Reading every PS's step records once, and knowing what was missed.

A gate keeps a bounded history of finished (step, worker) records, each numbered as it
finished (``seq``; gate.h, ``Gate.read``). A :class:`RecordCursor` holds one long-lived
client per PS and the number of the last record it read there: each read asks for the
records after it, and the gate says how many of those its history bound let go
(``dropped``). Nothing is read twice, and nothing is lost without being counted.
The PSes are read in parallel (one thread each, up to READ_THREADS), so a read costs
about the slowest PS's, not their sum; each PS's read time is kept (``read_seconds``).

Example:
  cursor = RecordCursor(["127.0.0.1:2222"])
  cursor.start()             # from now on: records finished after this call
  new = cursor.read()        # CursorRead(steps=[GateStep, ...], dropped={address: 0})
  cursor.close()
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from tictac_hooks.enforce.api import GateClient
from tictac_hooks.enforce.pool import GateClients
from tictac_hooks.records import GateStats, GateStep

log = logging.getLogger("tictac")

# A ``since`` past any record a gate will number: a read that only learns last_seq.
TAIL = 1 << 53
READ_THREADS = 16  # PSes read at once


@dataclasses.dataclass(frozen=True)
class CursorRead:
    """What one read brought: the new records (finished ones once each, then the active
    ones when asked for, seq 0), per PS the records lost since the last read, and the
    PSes that were restarted since."""

    steps: list[GateStep]
    dropped: dict[str, int]
    # The PSes whose gate is new since the last read (restarted: no order, records
    # numbered from 1 again), in address order.
    restarted: tuple[str, ...] = ()


@dataclasses.dataclass
class ReadTimes:
    """The seconds the reads of one PS took."""

    reads: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def add(self, seconds: float) -> None:
        self.reads += 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)

    def to_json(self) -> dict[str, float]:
        return {"reads": self.reads,
                "mean_ms": round(1e3 * self.total_s / self.reads, 3) if self.reads else 0.0,
                "max_ms": round(1e3 * self.max_s, 3)}


class RecordCursor:
    """One long-lived client per PS and the seq of the last record read there.

    Args:
      addresses: the PS addresses.
      timeout_s: per control call (default 10 s).
      connect: makes a client for an address (default enforce.client.connect).
      clients: the run's :class:`GateClients` to read through (their clients are
        shared, and left open by :meth:`close`); None: a pool of the cursor's own.

    Thread-safe: the reading thread and the training loop's own reads (at the switch,
    at the end) share it.
    """

    def __init__(self, addresses: Sequence[str], timeout_s: float = 10.0,
                 connect: Callable[[str, float], GateClient] | None = None,
                 clients: GateClients | None = None) -> None:
        self.addresses = list(addresses)
        self.timeout_s = timeout_s
        self._owns_clients = clients is None
        if clients is None and connect is None:
            from tictac_hooks.enforce.client import connect as connect_to
            connect = lambda a, t: connect_to(a, t)  # noqa: E731
        self._gates = clients or GateClients(self.addresses, connect, timeout_s)
        self._since: dict[str, int] = {a: 0 for a in self.addresses}
        self._lock = threading.Lock()
        self.read_records: collections.Counter[str] = collections.Counter()  # finished
        self.dropped: collections.Counter[str] = collections.Counter()
        self.active_records = 0  # active records in the last read that asked for them
        self.restarts: collections.Counter[str] = collections.Counter()
        # Per PS: the records its gate keeps (history_limit, as it reports it), and the
        # seconds each read of it took (reads, total, longest).
        self.history_limit: dict[str, int] = {}
        # Per PS: the id of the gate last read (GateStats.instance; "": not said).
        self.instance: dict[str, str] = {}
        self.read_seconds: dict[str, ReadTimes] = {a: ReadTimes() for a in self.addresses}
        self._pool: ThreadPoolExecutor | None = None

    def _stats(self, address: str, include_active: bool, since: int) -> GateStats:
        with self._gates.using(address) as client:  # a failure: reconnect next read
            return client.stats(include_active, since=since)

    def start(self, after: float | None = None) -> None:
        """Skips every record finished before now (an earlier run's); with ``after`` (a
        wall time), only those of steps that started before it: a reader made after
        steps it must see (the bench's, made after its profiled steps; any made more
        than a finish bound after them) still reads them, as far as the gate's history
        holds them."""
        with self._lock:
            for address in self.addresses:
                if after is None:
                    reply = self._stats(address, False, TAIL)
                    self._since[address] = reply.last_seq
                else:
                    reply = self._stats(address, False, 0)
                    mine = [s.seq for s in reply.steps if s.seq and s.start >= after]
                    self._since[address] = min(mine) - 1 if mine else reply.last_seq
                self.instance[address] = reply.instance

    def read(self, include_active: bool = False) -> CursorRead:
        """The records finished since the last read, at every PS (and the active ones,
        if ``include_active``: they come again, finished, in a later read). The PSes
        are read in parallel; a PS that fails the read fails it (after the others), and
        nothing of it is kept: the next read finds the same records, and a PS that
        restarted meanwhile is reported restarted then."""
        with self._lock:
            if len(self.addresses) > 1 and self._pool is None:
                self._pool = ThreadPoolExecutor(min(READ_THREADS, len(self.addresses)),
                                                thread_name_prefix="tictac-read")
            one = lambda a: self._read_one(a, include_active)  # noqa: E731
            replies = (list(self._pool.map(one, self.addresses)) if self._pool
                       else [one(a) for a in self.addresses])
            steps: list[GateStep] = []
            dropped: dict[str, int] = {}
            active = 0
            restarted = tuple(a for a, (_, new) in zip(self.addresses, replies) if new)
            for address, (reply, new) in zip(self.addresses, replies):
                if new:
                    self.restarts[address] += 1
                if reply.instance:
                    self.instance[address] = reply.instance
                self._since[address] = reply.last_seq
                if reply.history_limit:
                    self.history_limit[address] = reply.history_limit
                dropped[address] = reply.dropped
                self.dropped[address] += dropped[address]
                for step in reply.steps:
                    if step.seq:
                        self.read_records[address] += 1
                    else:
                        active += 1
                    steps.append(step)
            if include_active:
                self.active_records = active
        return CursorRead(steps, dropped, restarted)

    def _read_one(self, address: str, include_active: bool) -> tuple[GateStats, bool]:
        """One PS's reply, and whether its gate is new since the last read: another
        id (a gate that says none: its record numbers went back). Keeps only the
        read's time: :meth:`read` keeps what every PS answered, or nothing."""
        started = time.perf_counter()
        since = self._since[address]
        reply = self._stats(address, include_active, since)
        known = self.instance.get(address, "")
        restarted = (reply.instance != known if reply.instance and known
                     else reply.last_seq < since)
        if restarted and reply.since:
            # Its records are numbered from 1 again: read all it holds.
            reply = self._stats(address, include_active, 0)
        self.read_seconds[address].add(time.perf_counter() - started)
        return reply, restarted

    def smallest_history(self) -> int | None:
        """The fewest records any PS's gate keeps (None: none said yet)."""
        return min(self.history_limit.values(), default=None)

    def close(self) -> None:
        with self._lock:
            if self._owns_clients:
                self._gates.close()
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None
