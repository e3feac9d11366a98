"""The ordering gate: per (step, destination) counters that release transfers in priority
order (paper section 5), never waiting forever.

Pure asyncio, no gRPC: the rendezvous server calls it for every RecvTensor. A transfer
with (local) priority ``p`` is handed back once ``p`` transfers of its (step_id,
destination device) have been handed back or skipped; the counter advances at the moment
a transfer is handed back. A listed transfer that does not come within ``skip_after_s``
of the counter's last advance, while later ones wait, is skipped and counted; one that was
skipped in ``presume_absent_after`` consecutive steps is skipped at once from then on
(still counted; the streak is per destination), so a schedule that names a transfer that
never happens costs one bound, not one per step. Unlisted transfers pass straight
through. One worker is one task: the destination is the key's task, whatever device of
it the read lands on (``naming.worker_of``).

A step's life is measured in time, never in other steps (gate.h says the same for the
native gate): a (step, destination) channel is finished once nothing of it is held or in
flight and it has been quiet for ``finish_after_s``, or, whatever it holds, once it has
been quiet for ``stale_after_s``; its record is then numbered and readable. Only a stale
channel, shutdown, or more than ``max_active_steps`` live steps (a memory bound sized
with the workers that a healthy cluster never reaches) let a transfer go out of its
order, and each such transfer's record says why (``TransferRecord.early``); the totals
count them. A request that comes after its channel finished passes straight through
(``after_finish`` in the totals), never waiting on a counter that starts again at 0.
``history`` finished (step, worker) records are kept for stats.

Look-ahead window (``window_bytes``): the counter advances when the PS hands a response
back, which here is when its HEADERS come back through the rendezvous, one PS round trip
after the request was forwarded. The paper's counter lives inside the PS and advances
without that round trip, so a run of small transfers (biases, batch-norm parameters)
would leave the link idle for one round trip each. A listed transfer may therefore also
go when every transfer before it in the order has gone (released or skipped) and the
bytes released but not yet handed back, its own included, stay within ``window_bytes``
(sizes are learned from earlier steps; a transfer of unknown size never goes early). The
PS then answers up to a window of transfers back to back; their hand-back order may
differ from the schedule's only among those in flight together (``reordered`` in the
stats). ``window_bytes=0`` gives the strict one-at-a-time order.

The gate's bounds, tickets and channels are in ``gate_state.py``, a step's life (open,
supersede, sweep, finish) in ``gate_steps.py``; every name imports from here.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import secrets
import time
from typing import Any, Callable

from tictac_hooks import checks
from tictac_hooks.checks import check_window
# The gate's bounds, defaults and types, importable from here as they always were.
from tictac_hooks.enforce.gate_state import (
    DEFAULT_FINISH_AFTER_S, DEFAULT_SKIP_AFTER_S, DEFAULT_STALE_AFTER_S, DEFAULT_WINDOW_BYTES,
    DEFAULT_WORKERS, LIVE_STEPS_PER_WORKER, RECORDS_PER_WORKER, InstallResult, Ticket,
    _Channel, _Installed)
from tictac_hooks.enforce.gate_steps import _StepLife
from tictac_hooks.graph.schedule import Schedule
from tictac_hooks.graph.tf.naming import worker_of
# (every ticket state among them, PASS too: Ticket.state's values, records.STATES)
from tictac_hooks.records import (ABSENT, CANCELLED, DUPLICATE, LATE, LISTED,  # noqa: F401
                                  PASS, SLOW, TIMEOUT, UNEXPECTED, GateStats, GateStep)


class Gate(_StepLife):
    """Releases RecvTensor responses per (step_id, destination) in schedule order.

    Args:
      skip_after_s: the skip bound: how long the counter may stand still, while a later
        transfer waits, before the transfer it waits for is skipped (default
        ``DEFAULT_SKIP_AFTER_S``, 2.0 s; the same bound as ``--tictac_skip_timeout``).
      window_bytes: the look-ahead window (see the module docstring; default
        ``DEFAULT_WINDOW_BYTES``, 0 for strictly one transfer at a time).
      presume_absent_after: after this many consecutive steps in which a transfer was
        skipped for not coming, skip it at once (default 2; 0 turns this off).
      workers: the workers the bounds are sized for (default ``DEFAULT_WORKERS``, 64):
        ``max_active_steps`` and ``history`` where they are not given.
      max_active_steps: live steps at once, a memory bound; past it the oldest is
        finished and what it holds goes, marked evicted (default
        ``LIVE_STEPS_PER_WORKER`` x workers).
      history: finished (step, worker) records kept for stats (default
        ``RECORDS_PER_WORKER`` x workers); they are numbered as they finish, so a
        reader learns what it missed (:meth:`read`).
      finish_after_s: a channel with nothing held or in flight finishes once quiet this
        long (default ``DEFAULT_FINISH_AFTER_S``, 1.0 s).
      stale_after_s: a channel finishes once quiet this long, whatever it holds
        (default ``DEFAULT_STALE_AFTER_S``, 60 s).
      max_served_names: distinct transfer names remembered (default 100000).
      clock: wall clock for the records (default time.time).
    """

    def __init__(self, skip_after_s: float = DEFAULT_SKIP_AFTER_S,
                 window_bytes: int = DEFAULT_WINDOW_BYTES,
                 presume_absent_after: int = 2,
                 max_active_steps: int | None = None, history: int | None = None,
                 max_served_names: int = 100_000,
                 clock: Callable[[], float] = time.time,
                 workers: int = DEFAULT_WORKERS,
                 finish_after_s: float = DEFAULT_FINISH_AFTER_S,
                 stale_after_s: float = DEFAULT_STALE_AFTER_S) -> None:
        self.skip_after_s = checks.seconds("skip_after_s", skip_after_s)
        self.window_bytes = check_window(window_bytes)
        self.presume_absent_after = presume_absent_after
        workers = checks.whole_number("workers", workers, 1)
        self.max_active_steps = (LIVE_STEPS_PER_WORKER * workers if max_active_steps is None
                                 else checks.whole_number("max_active_steps",
                                                          max_active_steps, 1))
        history = (RECORDS_PER_WORKER * workers if history is None
                   else checks.whole_number("history", history, 1))
        self.finish_after_s = checks.seconds("finish_after_s", finish_after_s)
        self.stale_after_s = checks.seconds("stale_after_s", stale_after_s)
        self.max_served_names = max_served_names
        self.clock = clock
        # New in every gate: a PS restarted at the same address has another (GateStats).
        self.instance = secrets.token_hex(8)
        self._installed: _Installed | None = None
        self._versions = itertools.count(1)
        self._seq = itertools.count()
        self._steps: collections.OrderedDict[int, dict[str, _Channel]] = collections.OrderedDict()
        self._step_binding: dict[int, _Installed | None] = {}
        self._history: collections.deque[GateStep] = collections.deque(maxlen=history)
        self._last_seq = 0                         # seq of the newest finished record
        self._dest_records: dict[str, int] = {}    # destination -> its last worker_seq
        self._served: set[str] = set()
        self._served_by_dest: dict[str, set[str]] = collections.defaultdict(set)
        # What finished (whole) steps served: what an install restricts the order to.
        self._whole: set[str] = set()
        self._whole_by_dest: dict[str, set[str]] = collections.defaultdict(set)
        self._views: dict[tuple[int, str], _Installed] = {}
        self._served_at_install: dict[str, set[str]] = {}
        self._latest: dict[str, _Channel] = {}     # destination -> its newest channel
        self._absent_streak: dict[tuple[str, str], int] = {}  # (destination, name)
        self._sizes: dict[str, int] = {}   # response bytes per transfer name, last seen
        self.totals = collections.Counter()
        # Finished (step, destination) channels, for a request that comes after its
        # channel finished: key -> when, oldest first.
        self._finished: collections.OrderedDict[tuple, float] = collections.OrderedDict()
        self._last_sweep = 0.0
        self._sweep_timer: asyncio.TimerHandle | None = None

    # -- schedules -------------------------------------------------------------------

    def install(self, schedule: Schedule, skip_after_s: float | None = None,
                window_bytes: int | None = None) -> InstallResult:
        """Installs ``schedule``; steps that start from now on run under it. A given
        ``skip_after_s`` or ``window_bytes`` (checked as in the constructor) replaces
        the gate's setting."""
        if skip_after_s is not None:
            self.skip_after_s = checks.seconds("skip_after_s", skip_after_s)
        if window_bytes is not None:
            self.window_bytes = check_window(window_bytes)
        self._sweep(self.clock(), force=True)  # quiet steps are whole (gate_pacing.cc: timer)
        # Restricted to what was served once a step is whole (before, half a step would
        # leave the rest of it unexpected: every listed name is expected).
        served = set(self._served) if self._whole else set()
        names = set(schedule.order)
        expected = names & served if served else names
        unmatched = tuple(n for n in schedule.order if served and n not in served)
        self._installed = _Installed(next(self._versions), schedule, expected)
        # What each destination with a whole step had been served when installed.
        self._served_at_install = {d: set(self._served_by_dest[d])
                                   for d, n in self._whole_by_dest.items() if n}
        self._views.clear()
        self._absent_streak.clear()
        return InstallResult(self._installed.version, len(schedule), len(expected),
                             unmatched, len(self._served))

    def clear(self) -> int:
        """Removes the schedule; steps that start from now on pass straight through."""
        self._installed = None
        self._views.clear()
        self._absent_streak.clear()
        return next(self._versions)

    @property
    def schedule_version(self) -> int | None:
        return self._installed.version if self._installed else None

    # -- the transfer path -----------------------------------------------------------

    def arrive(self, step_id: int, dest: str, name: str, tensor: str = "",
               frame: int = 0, iteration: int = 0) -> Ticket:
        """Registers a RecvTensor request; call before forwarding it upstream.

        ``frame`` and ``iteration`` are the key's ``frame:iter``: each iteration of a
        loop (Keras's ``steps_per_execution > 1``) is a training step of its own, with
        its own counter and record.

        ``name`` is the sending node, ``tensor`` the key's full tensor name
        (``edge_<n>_<name>``). A tensor sent over two edges in one step arrives twice
        under one ``name``; both full names then count as served, and a schedule that
        lists a full name orders that copy by it (``extract_partition_graphs`` names
        such copies that way)."""
        now = self.clock()
        dest = worker_of(dest)  # one worker is one task, whatever its device
        self._sweep(now)
        step = step_id if not (frame or iteration) else (step_id, frame, iteration)
        if (step, dest) in self._finished:
            # Its channel finished already: straight through, counted, never a new
            # counter at 0 that would wait on every name the step already had.
            self.totals["after_finish"] += 1
            return Ticket(step_id, dest, name, now)
        channel = self._channel(step_id, dest, now, frame, iteration)
        channel.t_last = now
        room = len(self._served) < self.max_served_names
        if tensor and tensor != name:
            first = channel.tensors.setdefault(name, tensor)
            if first != tensor:
                if room:
                    self._served.update((first, tensor))
                    self._served_by_dest[dest].update((first, tensor))
                channel.served.update((first, tensor))
            if channel.installed is not None and tensor in channel.installed.priority:
                name = tensor
        ticket = Ticket(step_id, dest, name, now)
        if tensor and tensor != name:
            ticket.tensor = tensor
        if room:
            self._served.add(name)
            self._served_by_dest[dest].add(name)
        channel.served.add(name)
        ticket.channel = channel
        channel.live.add(ticket)
        installed = channel.installed
        priority = installed.priority.get(name) if installed else None
        if priority is not None:
            if name in channel.arrived:
                ticket.state = DUPLICATE
            elif name in channel.done:
                ticket.state = LATE
            else:
                ticket.state = LISTED
                ticket.priority = priority
            channel.arrived.add(name)
        elif installed is not None and name in installed.listed:
            ticket.state = UNEXPECTED
        return ticket

    def request(self, ticket: Ticket) -> asyncio.Future | None:
        """The request is complete. Returns None if it may be forwarded to the PS now,
        else a future that is done when it may (its turn, or a skip)."""
        channel = ticket.channel
        if ticket.state != LISTED or channel is None:
            ticket.t_release = self.clock()
            return None
        if ticket.priority <= channel.counter:
            self._mark_released(channel, ticket)
            if channel.waiters:
                self._pump(channel)  # the window may let later ones go with it
            return None
        ticket.seq = next(self._seq)
        ticket.future = asyncio.get_running_loop().create_future()
        heapq.heappush(channel.waiters, ticket)
        self._pump(channel)
        return None if ticket.future.done() else ticket.future

    def completed(self, ticket: Ticket) -> None:
        """The response ended (its last frame passed): remembers the transfer's size for
        the window."""
        if ticket.nbytes and (
                ticket.name in self._sizes or len(self._sizes) < self.max_served_names):
            self._sizes[ticket.name] = ticket.nbytes

    def handed_back(self, ticket: Ticket, error: str = "") -> None:
        """The PS handed the response to gRPC (its first HEADERS frame went out): the
        counter of the transfer's (step, destination) advances."""
        ticket.t_handback = self.clock()
        ticket.error = error
        channel = ticket.channel
        if channel is None:
            return  # its channel finished before it (after_finish, or ``early`` says why)
        channel.live.discard(ticket)
        channel.t_last = ticket.t_handback
        if ticket.state == LISTED and ticket.name in channel.done:
            ticket.state = LATE  # skipped while it was on its way
        channel.inflight -= ticket.charge
        ticket.charge = 0
        self._release(channel, ticket)
        self._pump(channel)

    def abandon(self, ticket: Ticket) -> None:
        """The call ended without a response (cancelled, or failed before :meth:`ready`)."""
        channel = ticket.channel
        if channel is None:
            return
        channel.live.discard(ticket)
        if ticket in channel.waiters:
            channel.waiters.remove(ticket)
            heapq.heapify(channel.waiters)
        channel.inflight -= ticket.charge
        ticket.charge = 0
        if ticket.state == LISTED and ticket.name not in channel.done:
            self._skip(channel, ticket.name, CANCELLED)
            self._pump(channel)

    # -- stats -----------------------------------------------------------------------

    def records(self, include_active: bool = True) -> list[dict[str, Any]]:
        """Per (step, worker) records, oldest first: finished ones, then active ones, in
        the wire format of ``stats`` (:meth:`GateStep.to_json`)."""
        return [step.to_json() for step in self.steps(include_active)]

    def steps(self, include_active: bool = True, since: int = 0) -> list[GateStep]:
        """:meth:`records` as :class:`GateStep` objects; finished ones only after record
        number ``since``. Active records have seq 0 and the worker_seq they will finish
        with (steps finish oldest first)."""
        self._sweep(self.clock(), force=True)  # every quiet channel's record is readable
        out = [r for r in self._history if r.seq > since]
        if include_active:
            following = dict(self._dest_records)
            for chans in self._steps.values():
                for ch in chans.values():
                    if ch.finished:
                        continue  # its record is in the history already
                    following[ch.dest] = following.get(ch.dest, 0) + 1
                    out.append(ch.record(0, following[ch.dest]))
        return out

    def read(self, since: int = 0, include_active: bool = True) -> dict[str, Any]:
        """A cursor's read: the records finished after record number ``since`` (0: every
        one held), the active ones if asked, ``last_seq`` (pass it as the next read's
        ``since``) and ``dropped``: records after ``since`` that the history bound let go
        before this read. The wire format of ``stats`` with ``since`` (both gates)."""
        since = checks.whole_number("since", since, 0)
        return {"since": since, "last_seq": self._last_seq,
                "dropped": self._dropped_after(since),
                "steps": [r.to_json() for r in self.steps(include_active, since)]}

    def stats(self, include_active: bool = True, since: int | None = None, ps: str = "",
              backend: str = "inprocess", upstream: str = "") -> GateStats:
        """What ``stats`` answers (:class:`~tictac_hooks.records.GateStats`): the
        summary and every record held, or with ``since`` a cursor's read
        (:meth:`read`)."""
        summary = self.summary()
        if since is None:
            steps, last_seq, dropped = self.steps(include_active), self._last_seq, 0
        else:
            since = checks.whole_number("since", since, 0)
            steps = self.steps(include_active, since)
            last_seq, dropped = self._last_seq, self._dropped_after(since)
        return GateStats(ps=ps, backend=backend, steps=tuple(steps), since=since,
                         last_seq=last_seq, dropped=dropped, upstream=upstream, **summary)

    def _dropped_after(self, since: int) -> int:
        """Records after number ``since`` that the history bound let go."""
        oldest = self._history[0].seq if self._history else self._last_seq + 1
        return max(0, oldest - 1 - since)

    def summary(self) -> dict[str, Any]:
        return {"instance": self.instance, "schedule_version": self.schedule_version,
                "algorithm": self._installed.algorithm if self._installed else None,
                "expected": self._installed.size if self._installed else 0,
                "window_bytes": self.window_bytes,
                "finish_after_s": self.finish_after_s,
                "active_steps": len(self._steps), "history": len(self._history),
                "history_limit": self._history.maxlen,
                "served_names": len(self._served), "totals": dict(self.totals)}

    def served_names(self) -> list[str]:
        return sorted(self._served)

    # -- the counter (a step's life: gate_steps.py) ----------------------------------

    def _mark_released(self, channel: _Channel, ticket: Ticket) -> None:
        """Bookkeeping for a listed ticket forwarded to the PS."""
        ticket.t_release = self.clock()
        ticket.rseq = next(self._seq)
        channel.released.add(ticket.name)
        # Unknown size: counts as a full window, so nothing goes early beside it.
        ticket.charge = self._sizes.get(ticket.name, self.window_bytes)
        channel.inflight += ticket.charge

    def _early(self, channel: _Channel, ticket: Ticket) -> bool:
        """May ``ticket`` go before its turn (the look-ahead window)?"""
        if not self.window_bytes:
            return False
        size = self._sizes.get(ticket.name)
        return (size is not None and channel.inflight + size <= self.window_bytes
                and channel.gone_prefix() >= ticket.priority)

    def _release(self, channel: _Channel, ticket: Ticket) -> None:
        if ticket.state == LISTED and ticket.name not in channel.done:
            channel.done.add(ticket.name)
            channel.counter += 1
            self._absent_streak.pop((channel.dest, ticket.name), None)
        channel.handed.append(ticket)
        self.totals[ticket.state] += 1

    def _skip(self, channel: _Channel, name: str, reason: str) -> None:
        channel.done.add(name)
        channel.counter += 1
        channel.skipped.append((name, reason, self.clock()))
        self.totals["skipped"] += 1
        if name not in channel.arrived and reason != CANCELLED:
            streak = (channel.dest, name)
            self._absent_streak[streak] = self._absent_streak.get(streak, 0) + 1

    def _pump(self, channel: _Channel) -> None:
        """Hands back every waiter whose turn has come; skips presumed-absent blockers."""
        before = channel.counter
        while True:
            while channel.waiters and (channel.waiters[0].priority <= channel.counter
                                       or self._early(channel, channel.waiters[0])):
                ticket = heapq.heappop(channel.waiters)
                self._mark_released(channel, ticket)
                if not ticket.future.done():
                    ticket.future.set_result(None)
            if not channel.waiters or not self.presume_absent_after:
                break
            blocker = channel.next_missing()
            if (blocker is None or blocker in channel.arrived
                    or self._absent_streak.get((channel.dest, blocker), 0)
                    < self.presume_absent_after):
                break
            self._skip(channel, blocker, ABSENT)
        if channel.waiters:
            if channel.timer is None or channel.counter != before:
                self._arm(channel)
        elif channel.timer is not None:
            channel.timer.cancel()
            channel.timer = None

    def _arm(self, channel: _Channel) -> None:
        if channel.timer is not None:
            channel.timer.cancel()
        loop = asyncio.get_running_loop()
        channel.timer = loop.call_later(self.skip_after_s, self._on_stall, channel)

    def _on_stall(self, channel: _Channel) -> None:
        channel.timer = None
        if not channel.waiters:
            return
        blocker = channel.next_missing()
        if blocker is None:  # cannot happen with competition-ranked priorities
            blocker = channel.waiters[0].name
        self._skip(channel, blocker, SLOW if blocker in channel.arrived else TIMEOUT)
        self._pump(channel)
        if channel.waiters and channel.timer is None:
            self._arm(channel)
