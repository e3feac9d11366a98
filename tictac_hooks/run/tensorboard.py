"""TensorBoard summaries of what TicTac did: step time per worker and order, phase, E.

Step times go to two runs, one per transfer order (``tensorflow_order``,
``tictac_order``), with one tag per worker, so that each worker's chart draws its steps
in TensorFlow's order and in TicTac's as two lines of two colours, the same two in
every chart: the switch, and each block of the order check, is where the colour
changes. Everything else goes to one run per worker (``worker_0``, ``worker_1``, ...).
Tags (each with its description; the chart title carries the unit):
  tictac/step_time/<worker>   [s] from this step's first parameter transfer to the
                              next step's (the worker's iteration period, read at the
                              PS), with TicTac's own pauses (profiling compute,
                              computing the order) taken out; in the per-order runs
  tictac/throughput/<worker>  [steps/s] 1 / step_time; in the per-order runs
  tictac/phase            0 profiling (TensorFlow's order), 1 TicTac's order, 2 a check
                          block in TensorFlow's order after the switch
  tictac/efficiency       measured E of the step, (U - m) / (U - L) (paper Eq. 4),
                          written only where it is defined (L <= m <= U)
  tictac/transfer_span    [s] between the step's first and last transfer
  tictac/choice           1 TicTac's order kept by the order check, 0 TensorFlow's
  tictac/block_step_time/<worker>  [s] the median step time of each order-check block,
                          at every step of the block; in the per-order runs
Text notes in each worker's run: ``tictac/switch`` at the worker's first scheduled step,
``tictac/check`` with the order check's decision.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable

from tictac_hooks.records import CHECK, PROFILING, SCHEDULED, CheckResult, WorkerStep

def worker_run_name(device: str) -> str:
    """``/job:worker/replica:0/task:1/device:CPU:0`` -> ``worker_1``."""
    from tictac_hooks.graph.tf.naming import task_of
    task = task_of(device)
    return task.replace(":", "_") if task else re.sub(r"[^A-Za-z0-9_.-]", "_", device)


ORDER_RUNS = {PROFILING: "tensorflow_order", CHECK: "tensorflow_order",
              SCHEDULED: "tictac_order"}

UNITS = {"tictac/step_time": "s", "tictac/throughput": "steps/s",
         "tictac/block_step_time": "s",
         "tictac/transfer_span": "s"}

DESCRIPTIONS = {
    "tictac/step_time": "Seconds per step of this worker, from one step's first parameter "
                        "transfer to the next's, read at the PS (TicTac's own pauses taken "
                        "out). Runs: tensorflow_order (profiling and check blocks) and "
                        "tictac_order.",
    "tictac/throughput": "Steps per second of this worker (1 / step_time), per order.",
    "tictac/phase": "0: profiling in TensorFlow's order; 1: TicTac's order installed; "
                    "2: an order-check block in TensorFlow's order after the switch.",
    "tictac/efficiency": "Measured E = (U - m) / (U - L) of the step (paper Eq. 4; 1: "
                         "communication fully overlapped); only where L <= m <= U.",
    "tictac/transfer_span": "Seconds between the step's first and last parameter "
                            "transfer, at the PS.",
    "tictac/choice": "The order check's decision: 1 TicTac's order kept, 0 TensorFlow's.",
    "tictac/block_step_time": "Median step time of each block of the order check (its "
                              "first step dropped), drawn at every step of the block.",
}


class StepTimeWriter:
    """Writes :class:`WorkerStep` series as TensorBoard scalars (see module docstring).

    Uses TensorBoard's own event-file writer and protos, not TensorFlow summary ops, so
    it works the same in eager programs and in finalized tf.compat.v1 graphs.
    """

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self._writers: dict[str, Any] = {}
        self._described: set[tuple[str, str]] = set()
        self._plain_metadata: Any = None
        self._switch_note: str | None = None
        self._coverage: float | None = None
        self._noted: set[str] = set()  # workers whose switch step got its note
        self._last_step: dict[str, int] = {}

    def _writer(self, run: str) -> Any:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        if run not in self._writers:
            self._writers[run] = EventFileWriter(os.path.join(self.log_dir, run))
        return self._writers[run]

    def _scalars(self, run: str, step: int, wall_time: float,
                 values: dict[str, float]) -> None:
        """New-style scalar summaries (a float tensor with the scalars plugin's
        metadata: its display name carries the unit, its description what the series
        means); TensorBoard's fast loader keeps metadata only in this form."""
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
        from tensorboard.plugins.scalar import metadata as scalar_metadata
        out = []
        for tag, v in values.items():
            if (run, tag) not in self._described:  # TensorBoard reads the first one
                self._described.add((run, tag))
                base = "/".join(tag.split("/")[:2])
                unit = UNITS.get(base)
                meta = scalar_metadata.create_summary_metadata(
                    display_name=f"{tag} [{unit}]" if unit else tag,
                    description=DESCRIPTIONS.get(base, ""))
            else:  # later values only need to say they are scalars
                if self._plain_metadata is None:
                    self._plain_metadata = scalar_metadata.create_summary_metadata(
                        display_name=None, description=None)
                meta = self._plain_metadata
            tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[float(v)])
            out.append(summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=meta))
        self._writer(run).add_event(event_pb2.Event(
            wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=out)))

    def write(self, records: Iterable[WorkerStep]) -> int:
        n = 0
        for r in records:
            run = worker_run_name(r.worker)
            values = {"tictac/phase": r.phase, "tictac/transfer_span": r.transfer_span}
            if r.efficiency is not None:
                values["tictac/efficiency"] = r.efficiency
            self._scalars(run, r.step, r.start, values)
            if r.step_time is not None and r.step_time > 0:
                self._scalars(ORDER_RUNS[r.phase], r.step, r.start,
                              {f"tictac/step_time/{run}": r.step_time,
                               f"tictac/throughput/{run}": 1.0 / r.step_time})
            if r.phase == SCHEDULED and run not in self._noted and self._switch_note:
                self._noted.add(run)
                self.text("tictac/switch", self._switch_note, run=run, step=r.step)
                if self._coverage is not None:
                    self._scalars(run, r.step, r.start,
                                  {"tictac/order_coverage_bytes": self._coverage})
            self._last_step[run] = r.step
            n += 1
        self.flush()
        return n

    def switched(self, algorithm: str, transfers: int, num_ps: int,
                 coverage: str | None = None, coverage_bytes: float | None = None) -> None:
        """Remembers the switch: each worker's run gets the note at its first scheduled
        step, and ``tictac/order_coverage_bytes`` (the share of the bytes the PSes
        served that the order lists) there."""
        self._switch_note = (f"TicTac's {algorithm.upper()} order ({transfers} transfers, "
                             f"{num_ps} PS{'; ' + coverage if coverage else ''}) "
                             "from this step on")
        self._coverage = coverage_bytes

    def choice(self, result: CheckResult) -> None:
        """The order check's decision: tictac/choice and a text note in every worker's
        run, at its last step written."""
        import time
        keep = result.decision != "default"
        from tictac_hooks.run.check_runner import verdict_line
        note = verdict_line(result)
        for run, step in sorted(self._last_step.items()):
            self._scalars(run, step, time.time(), {"tictac/choice": 1.0 if keep else 0.0})
            self.text("tictac/check", note, run=run, step=step)
        # Each block's median step time at every step of the block, per order: flat
        # segments, one colour per order, where the difference is plain to see.
        for worker, blocks in result.blocks.items():
            run = worker_run_name(worker)
            for block in blocks:
                for step in block.steps:
                    self._scalars(ORDER_RUNS[block.phase], step, time.time(),
                                  {f"tictac/block_step_time/{run}": block.median})
        self.flush()

    def text(self, tag: str, text: str, run: str, step: int = 0) -> None:
        import time
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
        from tensorboard.plugins.text import metadata
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[text.encode()])
        value = summary_pb2.Summary.Value(
            tag=tag, tensor=tensor, metadata=metadata.create_summary_metadata(tag, ""))
        self._writer(run).add_event(
            event_pb2.Event(wall_time=time.time(), step=step,
                            summary=summary_pb2.Summary(value=[value])))
        self.flush()

    def flush(self) -> None:
        for w in self._writers.values():
            w.flush()

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers.clear()


def read_scalars(log_dir: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """run -> tag -> [(step, value)] read back from the event files (for tests, reports);
    nested runs are named by their path, e.g. ``worker_0/tictac_order``."""
    import tensorflow as tf
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for root, _, files in sorted(os.walk(log_dir)):
        run = os.path.relpath(root, log_dir).replace(os.sep, "/")
        for name in sorted(files):
            if "tfevents" not in name:
                continue
            for event in tf.compat.v1.train.summary_iterator(os.path.join(root, name)):
                for value in event.summary.value:
                    if value.metadata.plugin_data.plugin_name not in ("", "scalars"):
                        continue  # text notes; other writers' graphs, histograms, ...
                    number = tf.make_ndarray(value.tensor) if value.HasField("tensor") \
                        else value.simple_value
                    if getattr(number, "size", 1) != 1:
                        continue
                    out.setdefault(run, {}).setdefault(value.tag, []).append(
                        (int(event.step), float(number)))
    return out
