"""Reading the PSes' step records off the training loop's thread (ReadingThread), telling
a lost worker from a slow one, and the summary of what was read."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from tictac_hooks.run.cluster_spec import task_answers
from tictac_hooks.run.steplog import StepLog
from tictac_hooks.graph.tf.naming import task_of
from tictac_hooks.records import GateStep

log = logging.getLogger("tictac")


# The reading thread reads the PSes' finished records every READ_EVERY_STEPS steps
# dispatched (fewer where a step makes more records than a quarter of the smallest
# gate history holds: each gate says its history_limit) and at least every READ_EVERY_S
# seconds.
READ_EVERY_STEPS = 32
READ_EVERY_S = 2.0
GATE_HISTORY = 256  # records a gate keeps, for a gate that does not say (older ones)
CATCH_UP_S = 1.0    # the longest a loop that outruns the reads waits for one
# A worker is lost when it has been silent for this many of its own step intervals
# while the others went on, and its task does not answer (or, where its address is
# unknown, for LOST_AFTER_STEPS of them). Counted in its own steps, not the others':
# the count means the same at 2 workers and at 64.
SUSPECT_AFTER_STEPS = 8
LOST_AFTER_STEPS = 64


class ReadingThread:
    """Reads the PSes' records off the training loop's thread: woken every
    ``every_steps`` dispatched steps (default: a quarter of a gate's history at the
    records per step seen so far, at most READ_EVERY_STEPS) and every READ_EVERY_S
    seconds. A failed read is logged once and tried again; it never stops training."""

    def __init__(self, read: Callable[[], None], every_steps: int | None,
                 cursor: Any = None) -> None:
        self._read = read
        self._fixed = every_steps
        self.every_steps = every_steps or READ_EVERY_STEPS
        self._cursor = cursor
        self._since_read = 0
        self._dispatched = 0
        self._wake = threading.Event()
        self._stopping = False
        self._failing = False
        # Back-pressure, for a loop that outruns the reads: past half a gate's history
        # of unread steps the loop waits (at most CATCH_UP_S) for a read to finish.
        self._read_started_at = 0  # steps dispatched when the last finished read began
        self._per_step = 1.0       # records a step makes at a PS, as measured
        self._caught_up = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tictac-records",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def dispatched(self, count: int) -> None:
        self._dispatched += count
        self._since_read += count
        if self._since_read >= self.every_steps:
            self._since_read = 0
            self._wake.set()
        limit = max(2 * self.every_steps, int(self._history() / 2 / self._per_step))
        if self._dispatched - self._read_started_at >= limit and not self._stopping:
            self._caught_up.clear()
            self._wake.set()
            self._caught_up.wait(CATCH_UP_S)  # never long: training goes on regardless

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stopping = True
        self._wake.set()
        self._caught_up.set()
        self._thread.join(timeout_s)

    def _history(self) -> int:
        """The fewest records a PS's gate keeps, as the gates say (GATE_HISTORY for a
        gate that does not)."""
        said = getattr(self._cursor, "smallest_history", lambda: None)()
        return said or GATE_HISTORY

    def _adapt(self) -> None:
        """Reads often enough that a quarter of the smallest gate history holds what
        finishes between two reads (a step makes a record per worker and loop
        iteration)."""
        if self._fixed or self._cursor is None or not self._dispatched:
            return
        per_step = max(self._cursor.read_records.values(), default=0) / self._dispatched
        if per_step > 0:
            self._per_step = per_step
            self.every_steps = max(1, min(READ_EVERY_STEPS,
                                          int(self._history() / 4 / per_step)))

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(READ_EVERY_S)
            self._wake.clear()
            if self._stopping:
                break
            started = self._dispatched
            try:
                self._read()
                self._adapt()
                self._failing = False
            except Exception as e:  # noqa: BLE001 - never stop training for a read
                if not self._failing:
                    log.warning("TicTac: reading the PSes' step records failed (%s: %s); "
                                "trying again", type(e).__name__, e)
                self._failing = True
            finally:
                self._read_started_at = started
                self._caught_up.set()



def find_lost_workers(steplog: StepLog, worker_addresses: Mapping[str, str],
                      probed: dict[str, float], say: Callable[[str], None]) -> None:
    """Marks a worker lost, with one line, when the others went on without it: for
    SUSPECT_AFTER_STEPS of its own step intervals and its task does not answer, or for
    LOST_AFTER_STEPS of them where its address is unknown; says, in one line each,
    the lost workers that came back. ``worker_addresses``: task ("worker:1") -> its
    address; ``probed``: worker -> when its task was last asked."""
    from tictac_hooks.run.tensorboard import worker_run_name
    for worker, info in steplog.returned_workers():
        say(f"{worker_run_name(worker)} ({worker}) is back: a new step of it arrived "
            f"after it was found lost ({info['reason']}); it is served in turn again")
    for worker in steplog.workers():
        if worker in steplog.lost:
            continue
        last, silent = steplog.silent(worker) or (0.0, 0.0)
        if silent < SUSPECT_AFTER_STEPS:
            continue
        address = worker_addresses.get(task_of(worker) or "")
        if address is not None:
            if time.time() - probed.get(worker, 0.0) < 1.0:
                continue
            probed[worker] = time.time()
            alive = task_answers(address)
            if alive is not False:
                continue
            reason = f"its task at {address} does not answer"
        elif silent >= LOST_AFTER_STEPS:
            reason = "no step of it since"
        else:
            continue
        now = time.time()
        steplog.mark_lost(worker, now, reason)
        say(f"{worker_run_name(worker)} ({worker}) lost: its last step started "
            f"at {time.strftime('%H:%M:%S', time.localtime(last))}, "
            f"{now - last:.1f} s ago, and the other workers went on for "
            f"{silent:.0f} of its step times since ({reason}); ParameterServerStrategy "
            "runs its work on the others, and its last step counts as unfinished")


def records_summary(dispatched: int, steplog: StepLog, cursor: Any,
                    ps_addresses: Sequence[str]) -> dict[str, Any]:
    """What was read: training steps dispatched; worker steps recorded, each
    training step once, where it finished; steps missing in gaps (so that
    worker_steps + missing = dispatched); unfinished: lost workers' last steps that
    another worker ran again (counted there); and per PS the records read and
    dropped (finished ones; the active ones of the last read beside). ``cursor``: the
    RecordCursor that read them (None: nothing was read)."""
    if cursor is None:
        return {"dispatched": dispatched}
    recorded, missing, held = steplog.totals()  # held: lost workers' last steps
    # A closure whose worker died mid-step ParameterServerStrategy runs again on
    # another worker, where it is recorded: it counts once, there. A lost worker's
    # last step that no other worker ran again had finished where it started.
    rerun = min(held, max(0, recorded + missing + held - dispatched))
    return {"dispatched": dispatched,
            "worker_steps": recorded + held - rerun,
            "missing": missing,
            "unfinished": rerun,
            "read": sum(cursor.read_records.values()) + cursor.active_records,
            "dropped": sum(cursor.dropped.values()),
            "per_ps": {ps: {"read": cursor.read_records[ps],
                            "dropped": cursor.dropped[ps],
                            "read_time": cursor.read_seconds[ps].to_json()}
                       for ps in ps_addresses}}


def wait_for_profiled_records(poll: Callable[[], Any], steplog: StepLog,
                              timeout_s: float = 30.0, steps: int = 2) -> bool:
    """Reads (``poll``: running steps' records too) until some worker has ``steps``
    profiled steps recorded, or ``timeout_s`` passed; whether it has. A worker runs its
    steps one after the other, so all but its latest are whole: the served names
    then hold every transfer of a step (a gather comes late in it, after the ids).
    For a switch that does not join the loop's dispatched steps."""
    deadline = time.monotonic() + timeout_s
    while True:
        poll()
        per_worker: dict[str, set] = {}
        for rec in steplog.profiled_records():
            if not rec.dead:
                per_worker.setdefault(rec.worker, set()).add((rec.step_id, rec.iteration))
        enough = any(len(keys) >= steps for keys in per_worker.values())
        if enough or time.monotonic() > deadline:
            return enough
        time.sleep(0.05)


TIMELINE_FILE = "tictac_transfers.trace.json"


# Step records the timeline file holds at most (each a step of one worker at one PS, with
# its transfers: about 3 kB for a model of 17 transfers, so about 60 MB in all); a run
# of more keeps its first ones, what its profiling, switch and first check show, and
# the file says how many it left out.
TIMELINE_RECORDS = 20_000


class TransferTimeline:
    """The transfer timeline (``tictac_transfers.trace.json`` in ``log_dir``), written
    from the step records as the cursor reads them (enforce/trace.py,
    :class:`~tictac_hooks.enforce.trace.TraceWriter`): memory stays bounded however
    long training runs, the file holds at most ``max_records`` step records, and
    nothing is fetched a second time at the end."""

    def __init__(self, log_dir: str, max_records: int = TIMELINE_RECORDS) -> None:
        from tictac_hooks.enforce.trace import TraceWriter
        os.makedirs(log_dir, exist_ok=True)
        self._file = open(os.path.join(log_dir, TIMELINE_FILE), "w")
        self._writer = TraceWriter(self._file, max_records=max_records)

    def add(self, steps: Iterable[GateStep], final: bool = False) -> None:
        """Writes the finished records of a read (an active one comes again, finished,
        in a later read); ``final``: the last read, whose active records never will."""
        self._writer.add(s for s in steps if final or s.seq)

    def close(self) -> None:
        if self._file.closed:
            return
        self._writer.close()
        self._file.close()


def write_logs(log_dir: str, summary: Mapping[str, Any]) -> None:
    """Writes ``summary`` (tictac_summary.json) to ``log_dir``, next to the event files
    and the transfer timeline."""
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, "tictac_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
