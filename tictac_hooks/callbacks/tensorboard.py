"""TensorBoard summaries of what TicTac did: step time per worker, phase, E, throughput.

One run directory per worker under ``log_dir`` (``worker_0``, ``worker_1``, ...), so
TensorBoard overlays the workers' step times in one chart. Tags:
  tictac/step_time        seconds from this step's first parameter transfer to the
                          next step's (the worker's iteration period, read at the PS)
  tictac/phase            0 while profiling (TensorFlow's own order), 1 once scheduled
  tictac/efficiency       measured E of the step, (U - m) / (U - L) (paper Eq. 4)
  tictac/throughput       steps per second of this worker
  tictac/transfer_span    seconds between the step's first and last transfer
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Iterable

PROFILING, SCHEDULED = 0, 1


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One step of one worker, as seen by the parameter servers."""

    worker: str            # destination device, e.g. /job:worker/replica:0/task:1/...
    step: int              # per-worker step index, from 0
    start: float           # wall-clock time of the step's first transfer
    step_time: float | None  # to the next step's start (None for the last step)
    transfer_span: float
    phase: int
    efficiency: float | None = None


def worker_run_name(device: str) -> str:
    """``/job:worker/replica:0/task:1/device:CPU:0`` -> ``worker_1``."""
    from tictac_hooks.graph.tf_extract import task_of
    task = task_of(device)
    return task.replace(":", "_") if task else re.sub(r"[^A-Za-z0-9_.-]", "_", device)


class StepTimeWriter:
    """Writes :class:`StepRecord` series as TensorBoard scalars.

    Uses TensorBoard's own event-file writer and protos, not TensorFlow summary ops, so
    it works the same in eager programs and in finalized tf.compat.v1 graphs.
    """

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self._writers: dict[str, Any] = {}

    def _writer(self, worker: str) -> Any:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        run = worker_run_name(worker)
        if run not in self._writers:
            self._writers[run] = EventFileWriter(os.path.join(self.log_dir, run))
        return self._writers[run]

    def _scalars(self, worker: str, step: int, wall_time: float,
                 values: dict[str, float]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        summary = summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()])
        self._writer(worker).add_event(
            event_pb2.Event(wall_time=wall_time, step=step, summary=summary))

    def write(self, records: Iterable[StepRecord]) -> int:
        n = 0
        for r in records:
            values = {"tictac/phase": r.phase, "tictac/transfer_span": r.transfer_span}
            if r.step_time is not None and r.step_time > 0:
                values["tictac/step_time"] = r.step_time
                values["tictac/throughput"] = 1.0 / r.step_time
            if r.efficiency is not None:
                values["tictac/efficiency"] = r.efficiency
            self._scalars(r.worker, r.step, r.start, values)
            n += 1
        self.flush()
        return n

    def text(self, tag: str, text: str, step: int = 0) -> None:
        import time
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
        from tensorboard.plugins.text import metadata
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[text.encode()])
        value = summary_pb2.Summary.Value(
            tag=tag, tensor=tensor, metadata=metadata.create_summary_metadata(tag, ""))
        self._writer("/job:tictac/replica:0/task:0").add_event(
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
    """run -> tag -> [(step, value)] read back from the event files (for tests, reports)."""
    import tensorflow as tf
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for run in sorted(os.listdir(log_dir)):
        run_dir = os.path.join(log_dir, run)
        if not os.path.isdir(run_dir):
            continue
        for name in sorted(os.listdir(run_dir)):
            if "tfevents" not in name:
                continue
            for event in tf.compat.v1.train.summary_iterator(os.path.join(run_dir, name)):
                for value in event.summary.value:
                    if value.metadata.plugin_data.plugin_name == "text":
                        continue
                    number = tf.make_ndarray(value.tensor) if value.HasField("tensor") \
                        else value.simple_value
                    out.setdefault(run, {}).setdefault(value.tag, []).append(
                        (int(event.step), float(number)))
    return out
