"""A step's life at the Python gate (:mod:`tictac_hooks.enforce.gate`, whose docstring
says when a channel finishes): a (step, destination) channel opened, bound to the
schedule its step started under; the worker's previous step superseded or whole; quiet
channels swept; a channel finished and its record numbered (gate_channels.cc in the
native gate)."""

from __future__ import annotations

import asyncio
import heapq
from typing import Any

from tictac_hooks.enforce.gate_state import _Channel, _Installed
from tictac_hooks.records import EVICTED, STALE, SUPERSEDED


class _StepLife:
    """The channel bookkeeping of :class:`~tictac_hooks.enforce.gate.Gate`, which holds
    the state these methods work on (its ``__init__``)."""

    def _channel(self, step_id: int, dest: str, now: float, frame: int = 0,
                 iteration: int = 0) -> _Channel:
        # Each loop iteration is a step of its own (gate_channels.cc's IterationKey).
        step = step_id if not (frame or iteration) else (step_id, frame, iteration)
        chans = self._steps.get(step)
        if chans is None:
            # A step binds to the schedule current at its first transfer (atomic install).
            chans = self._steps[step] = {}
            self._step_binding[step] = self._installed
            self._arm_sweep()
            # The memory bound only (sized with the workers): a healthy cluster never
            # has this many steps live; what the oldest holds goes now, marked evicted.
            while len(self._steps) > self.max_active_steps:
                old_step, old = self._steps.popitem(last=False)
                self._step_binding.pop(old_step, None)
                for ch in old.values():
                    if not ch.finished:
                        self._finish(ch, EVICTED)
                self.totals["evicted_steps"] += 1
        channel = chans.get(dest)
        if channel is None:
            self._supersede(step_id, dest)
            channel = chans[dest] = _Channel(step_id, dest, self._view(step, dest),
                                             frame, iteration, key=step)
            channel.t_first = channel.t_last = now
            self._latest[dest] = channel
        return channel

    def _supersede(self, step_id: int, dest: str) -> None:
        """A worker runs one step at a time: when it begins another step while its
        previous one has held transfers here, quiet, for ``finish_after_s``, it left
        that step (it was restarted, or the step was cancelled), so what that step
        holds goes now, marked superseded, instead of waiting for its turn and the skip
        bound (gate_channels.cc's Supersede); else that step is whole (:meth:`_whole_step`)."""
        last = self._latest.get(dest)
        if last is None or last.finished:
            return
        if (last.step_id != step_id and last.live
                and self.clock() - last.t_last >= self.finish_after_s):
            self.totals["superseded_steps"] += 1
            self._finish(last, SUPERSEDED)
        else:
            self._whole_step(last)  # its worker went on to the next: that step is whole

    def _whole_step(self, channel: _Channel) -> None:
        """An install restricts a destination's order to what it was served only once
        one of its steps is whole: half a step (a PS restarted mid-step, a worker's
        first step) would leave the rest of the step unexpected for as long as the
        install holds. A step is whole once it finished by itself or its worker opened
        its next one."""
        for name in channel.served:
            if len(self._whole) >= self.max_served_names:
                break
            self._whole.add(name)
            self._whole_by_dest[channel.dest].add(name)
        channel.served.clear()

    def _sweep(self, now: float, force: bool = False) -> None:
        """Finishes every channel that is quiet: nothing held or in flight for
        ``finish_after_s``, or anything for ``stale_after_s`` (at most every quarter
        of ``finish_after_s`` unless ``force``)."""
        if not force and now - self._last_sweep < self.finish_after_s / 4:
            return
        self._last_sweep = now
        for step in list(self._steps):
            chans = self._steps[step]
            for ch in chans.values():
                if ch.finished:
                    continue
                quiet = now - ch.t_last
                if not ch.live and quiet >= self.finish_after_s:
                    self._finish(ch)
                elif quiet >= self.stale_after_s:
                    self._finish(ch, STALE)
            if all(ch.finished for ch in chans.values()):
                del self._steps[step]
                self._step_binding.pop(step, None)
        keep = max(self.stale_after_s, 10 * self.finish_after_s)
        while self._finished and (len(self._finished) > 4 * self.max_active_steps
                                  or now - next(iter(self._finished.values())) > keep):
            self._finished.popitem(last=False)

    def _arm_sweep(self) -> None:
        """Sweeps on the event loop while steps live, so that quiet channels finish
        (and free their memory) without waiting for the next arrival or read."""
        if self._sweep_timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # driven without a loop: arrivals and reads sweep
        self._sweep_timer = loop.call_later(self.finish_after_s / 4, self._sweep_tick)

    def _sweep_tick(self) -> None:
        self._sweep_timer = None
        self._sweep(self.clock(), force=True)
        if self._steps:
            self._arm_sweep()

    def _view(self, step: Any, dest: str) -> _Installed | None:
        """The schedule a step bound to, as ``dest`` enforces it (cached per version)."""
        installed = self._step_binding[step]
        if installed is None:
            return None
        key = (installed.version, dest)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 4096:  # (version, destination) pairs
                self._views.clear()
            view = self._views[key] = installed.for_destination(
                self._served_at_install.get(dest, set()))
        return view

    def _finish(self, channel: _Channel, early: str = "") -> None:
        """Finishes a channel and keeps its record. What it still holds goes now, in
        priority order, and what is in flight goes unordered; each is marked ``early``
        (a reason of records.EARLY_REASONS; "" only when nothing is held)."""
        if channel.timer is not None:
            channel.timer.cancel()
            channel.timer = None
        why = early or STALE
        while channel.waiters:
            ticket = heapq.heappop(channel.waiters)
            ticket.t_release = self.clock()
            ticket.early = why
            if not ticket.future.done():
                ticket.future.set_result(None)
        for ticket in sorted(channel.live, key=lambda t: (t.priority, t.seq)):
            ticket.early = why
            ticket.channel = None
            channel.handed.append(ticket)
            self.totals[f"early_{why}"] += 1
        channel.live.clear()
        channel.finished = True
        if not early:  # (a step let go early, e.g. superseded, may be half a step)
            self._whole_step(channel)
        self._last_seq += 1
        worker_seq = self._dest_records[channel.dest] = \
            self._dest_records.get(channel.dest, 0) + 1
        self._history.append(channel.record(self._last_seq, worker_seq))
        self._finished[(channel.key, channel.dest)] = self.clock()
