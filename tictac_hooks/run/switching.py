"""The switch, as the controller runs it: the order computed from the worker DAG (TIC)
or the DAG plus measured times (TAC), with the order check's other candidates, and
installed on every PS; or an order saved by an earlier run of the job restored at once
(saved_order.py); or, when the switch fails, TensorFlow's order kept with one line.

:class:`Switching` is a part of :class:`~tictac_hooks.run.controller.Controller`
(its state is the controller's); it lives here to keep each module readable.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Mapping

from tictac_hooks.run import coverage, order_check, phases, planner, saved_order
from tictac_hooks.run.settings import TicTacSetupError
from tictac_hooks.graph.dag import Graph
from tictac_hooks.graph.schedule import Schedule, ScheduleError

log = logging.getLogger("tictac")


class Switching:
    """The controller's switch (see the module docstring)."""

    def switch(self, graphs: Graph | Mapping[str, Graph],
               compute_times: Mapping[str, float] | None = None,
               late: "set[str] | None" = None,
               holds_loop: bool = True, check_later: bool = False) -> Schedule | None:
        """Computes the order and installs it on every PS.

        ``graphs`` is the worker's DAG as traced, or one DAG per worker task when the
        workers receive differently named transfers (in-graph replication); each worker
        then gets its own order, and each PS enforces every worker's order for that
        worker. Recvs the PSes never served while profiling become free compute ops
        (PS-side reads). ``late`` names recvs that in TensorFlow depend on work done in
        the same step (e.g. a read of a variable after an update the worker's gradient
        feeds): they cannot be ready at the start of the step, so scheduling them early
        would stall every transfer behind them; they are left unscheduled (they pass
        the rendezvous straight through). ``compute_times`` (seconds per compute op) is
        needed for TAC and for measured E. With ``check_later`` (TIC, whose order needs
        no times), the order is installed at once and the order check waits for
        :meth:`timed`, which brings the compute times the other candidates need.
        Returns the (merged) schedule, or None for algorithm "none".
        """
        pause_start = time.time()
        self.poll()
        if isinstance(graphs, Graph):
            graphs = {"worker": graphs}
        self._fingerprint = saved_order.fingerprint(graphs, len(self.ps_addresses),
                                                    self.spread_over)
        served = set().union(*self.served_transfers().values())
        self._link_rate = self.config.bandwidth or self.link_rate()
        algorithm = self.settings.algorithm
        if algorithm == "none":
            self.say("algorithm 'none': profiling only, no schedule installed")
            return None
        self.phases.to(phases.SWITCHING, "the profiled steps ran")
        late = set(late or ())
        t0 = time.perf_counter()
        parts = None
        if algorithm == "tac":
            try:
                parts = self._parts_for(algorithm, graphs, compute_times, served, late)
            except TicTacSetupError as e:
                algorithm = self._fall_back_to_tic(str(e))
        if parts is None:
            parts = self._parts_for(algorithm, graphs, compute_times, served, late)
        candidates = {algorithm: parts}
        self.schedule = planner.merged(parts)
        if self.settings.log_dir:  # what `tictac whatif --profile LOG_DIR` reads
            planner.save_profile(self.settings.log_dir, parts[0][0], compute_times,
                                 self.steplog)
        self.coverage = coverage.measure(self.steplog.profiled_records(),
                                         set(self.schedule.order))
        self.say(f"{algorithm.upper()} order of {len(self.schedule)} transfers "
                 f"({self.coverage.phrase()}) computed in "
                 f"{(time.perf_counter() - t0) * 1e3:.0f} ms "
                 f"({len(parts)} worker DAG{'s' if len(parts) > 1 else ''})")
        short = coverage.warning(self.coverage, planner.why_unlisted(graphs, late))
        if short:
            log.warning("TicTac: %s", short)
        self._switched_on = (graphs, served, late)
        if not check_later:
            self._other_candidates(candidates, compute_times)
        # check_later: the check waits until timed()
        self.runner.switched(algorithm, candidates, self.spread_over,
                             wait_for_times=check_later)
        if self.installs:
            self._install(parts)
            self.runner.mark_installed(algorithm)
        self.steplog.mark_switched(time.time())
        if holds_loop:
            self.mark_pause(pause_start, time.time())
        if self._writer:
            self._writer.switched(algorithm, len(self.schedule), len(self.ps_addresses),
                                  self.coverage.phrase(), self.coverage.bytes_share)
        if not check_later:
            self.runner.start()
        self._sync_phase("the order installed")
        self._save_order()
        return self.schedule

    def timed(self, compute_times: Mapping[str, float] | None) -> None:
        """The compute times measured after a ``check_later`` switch (None: none could
        be): the order check's other candidates (TAC needs them), measured E, and the
        check's start."""
        candidates = dict(self.runner.candidates)
        if not candidates:
            return  # the switch failed, or ran no algorithm
        algorithm = next(iter(candidates))
        if compute_times is not None:  # the per-step compute time, for E
            self.compute_seconds = planner.compute_seconds(candidates[algorithm][0][0],
                                                           compute_times)
            if self.settings.log_dir:  # the profile again, with the compute times now
                planner.save_profile(self.settings.log_dir, candidates[algorithm][0][0],
                                     compute_times, self.steplog)
        self._other_candidates(candidates, compute_times)
        self.runner.switched(algorithm, candidates, self.spread_over)
        self.runner.start()
        self._sync_phase("the compute times measured")
        self._save_order()

    def _other_candidates(self, candidates: dict, compute_times) -> None:
        """The order check also tries the other algorithm where it can be computed (TAC
        needs measured compute times and transfer sizes), and the extra orders asked
        for (``check_extra``); what cannot be computed is left out, in one line."""
        if self.check is None:
            return
        graphs, served, late = self._switched_on
        algorithm = next(iter(candidates))
        other = {"tic": "tac", "tac": "tic"}[algorithm]
        try:
            candidates[other] = self._parts_for(other, graphs, compute_times, served, late)
        except (TicTacSetupError, ScheduleError) as e:
            self.say(f"the order check tries {algorithm.upper()} only: "
                     f"{other.upper()} is off ({e})")
            self.check_off[other] = str(e)
        for label, name in self.check_extra.items():
            if label in candidates:
                continue
            if name == "none":  # TensorFlow's own order as a candidate (A/A): no parts
                candidates[label] = None
                continue
            try:
                candidates[label] = [
                    (g, dataclasses.replace(s, algorithm=label)) for g, s in
                    self._parts_for(name, graphs, compute_times, served, late)]
            except (TicTacSetupError, ValueError) as e:  # ScheduleError included
                self.check_off[label] = str(e)
                self.say(f"the order check leaves {label} out: {e}")

    def restore(self, graphs: Graph | Mapping[str, Graph],
                saved: "saved_order.SavedOrder", path: str) -> bool:
        """The switch from an order saved by an earlier run of this job (``path``): if
        it was saved for this step function's DAG (``graphs``, as traced: names,
        inputs, PS and bytes) on a cluster of this shape, by this version, for this
        run's algorithm and link rate (the config's ``bandwidth``, which paces it as
        the switch would), installs the order it kept and checks it as usual, and returns True;
        else says why in one line and returns False (profile again)."""
        if isinstance(graphs, Graph):
            graphs = {"worker": graphs}
        here = saved_order.fingerprint(graphs, len(self.ps_addresses), self.spread_over)
        if here != saved.fingerprint:
            self.say(f"the order saved in {path} is for another step function or cluster "
                     f"(fingerprint {saved.fingerprint}; this run {here}, {len(graphs)} "
                     f"DAG(s), {len(self.ps_addresses)} PS x {self.spread_over} workers): "
                     f"profiling again")
            return False
        algorithm = self.settings.algorithm
        if algorithm not in saved.candidates:
            held = ", ".join(c.upper() for c in saved.candidates)
            self.say(f"the order saved in {path} holds {held}; this run asks for "
                     f"{algorithm.upper()}: profiling again")
            return False
        bandwidth = self.config.bandwidth
        if bandwidth and saved.link_rate and abs(bandwidth / saved.link_rate - 1) > 0.01:
            self.say(f"the order saved in {path} was computed for a link of "
                     f"{saved.link_rate * 8 / 1e9:.3g} Gbit/s; this run's is "
                     f"{bandwidth * 8 / 1e9:.3g} Gbit/s: profiling again")
            return False
        self._fingerprint, self.restored_from = here, path
        # A gate enforces the listed names it has served (a PS serves the chief's own
        # reads first): it installs once a worker step was served, as the switch does.
        self.wait_for_profiled_records()
        self.compute_seconds, self._link_rate = saved.compute_seconds, saved.link_rate
        if saved.coverage:
            self.coverage = coverage.Coverage.from_json(saved.coverage)
        algorithm = saved.kept or next(iter(saved.candidates))
        self.runner.switched(algorithm, saved.candidates, self.spread_over,
                             decided=saved.kept is not None)
        self.schedule = planner.merged(saved.candidates[algorithm])
        if saved.kept is not None and self.installs:
            self._install(saved.candidates[algorithm], quiet=True)
            self.runner.mark_installed(algorithm)
        self.steplog.mark_switched(time.time())
        kept = f"the {algorithm.upper()} order" if saved.kept else "TensorFlow's order"
        paced = ("" if saved.kept is None else
                 f", paced at {self.pace_rate * 8 / 1e9:.3g} Gbit/s" if self.pace_rate
                 else ", not paced (no bandwidth given)")
        self.say(f"order restored from {path} (saved for this step function on "
                 f"{len(self.ps_addresses)} PS x {self.spread_over} workers): {kept} "
                 f"installed at once{paced}, no profiling")
        self.runner.start()
        self._sync_phase("the saved order restored")
        return True

    def _save_order(self) -> None:
        """Writes the candidates and the order kept to ``order_dir`` (saved_order.py);
        a failure is one warning, never the run's."""
        if not (self.order_dir and self.installs and self._fingerprint
                and self.runner.candidates):
            return
        try:
            saved_order.save(self.order_dir, saved_order.SavedOrder(
                self._fingerprint, len(self.ps_addresses), self.spread_over,
                {c: p for c, p in self.runner.candidates.items() if p is not None},
                self.runner.decided if self.runner.candidates.get(self.runner.decided or "")
                is not None else None,
                self.coverage.to_json() if self.coverage else None,
                self.compute_seconds, self._link_rate))
        except OSError as e:
            log.warning("TicTac: the order could not be saved in %s for a restart (%s)",
                        self.order_dir, e)

    def _sync_phase(self, why: str) -> None:
        """The phase the check runner is in: checking while a check runs, switching
        while it waits for the compute times (TIC in place first), else decided."""
        if self.runner.running:
            self.phases.to(phases.CHECKING, why)
        elif self.runner.waiting:
            self.phases.to(phases.SWITCHING, why)
        else:
            self.phases.to(phases.DECIDED, why)

    def ended_unordered(self, reason: str) -> None:
        """Training ended before the order was in place: one line says so."""
        self.not_ordered_reason = reason
        self.say(reason)

    def compute_profile_failed(self, reason: str) -> None:
        """The frontend's compute profile failed (it said why in one warning line)."""
        self.compute_profile_error = reason

    def save_orders_in(self, directory: str | None) -> None:
        """Where the order is saved for a job restart (None: not saved)."""
        self.order_dir = directory

    def not_ordered(self, error: BaseException) -> None:
        """The switch failed: one line saying why, TensorFlow's order stays on every PS
        (nothing was installed, or it is cleared), no order check; training goes on."""
        reason = str(error) or type(error).__name__
        if not isinstance(error, (ScheduleError, TicTacSetupError)):
            reason = f"{type(error).__name__}: {reason}"
        self.not_ordered_reason = reason
        self.schedule = None
        self.runner.abandon()
        self.phases.to(phases.DECIDED, "the switch failed: TensorFlow's order")
        log.debug("TicTac: the switch failed", exc_info=error)
        self.say(f"TensorFlow's own transfer order kept, training goes on: {reason}")

    def _fall_back_to_tic(self, reason: str) -> str:
        """TAC cannot run (no compute profile, no transfer times): TIC for this run.
        Said in one line, unless the failed profile already said it."""
        self.tac_off = reason
        self.settings = dataclasses.replace(self.settings, algorithm="tic")
        if self.compute_profile_error is None:
            self.say(f"TAC is off for this run ({reason}): TIC instead")
        else:
            log.info("TicTac: TAC is off for this run (%s): TIC instead", reason)
        return "tic"

    def _parts_for(self, algorithm: str, graphs: Mapping[str, Graph],
                   compute_times: Mapping[str, float] | None, served: set[str],
                   late: set[str]) -> list[tuple[Graph, Schedule]]:
        """Each worker DAG, restricted to what the PSes served, with its order
        (planner.parts_for); notes the per-step compute time of the first."""
        parts = planner.parts_for(algorithm, graphs, compute_times, served, late,
                                  self._link_rate, self.steplog.transfer_bytes(),
                                  self.compute_profile_error)
        if compute_times is not None:
            self.compute_seconds = planner.compute_seconds(parts[0][0], compute_times)
        return parts

    def orders(self, algorithm: str | None = None) -> list[tuple[Graph, Schedule]]:
        """Per worker DAG (restricted to the recvs the PSes served) and its order, for
        ``algorithm`` (default: the configured one); computed at the switch."""
        return planner.orders(self.runner.candidates, algorithm or self.settings.algorithm)
