"""Time oracles from TensorFlow's own measurements (docs/ALGORITHMS.md, "TAC").

* :func:`times_from_step_stats`, :func:`transfers_from_step_stats` -- from graph-mode
  ``RunMetadata.step_stats`` (with :func:`tictac_hooks.graph.oracle.recv_times_from_transfers`
  and :func:`tictac_hooks.graph.oracle.recv_bytes_from_transfers` for the records).
* :func:`measure_compute_times` / :func:`profile_compute_times` -- per-op compute times
  of a ``tf.function`` measured on this machine with ``tf.profiler.experimental``.

Over N profiled steps we keep the MEDIAN per op by default. The paper kept the minimum of
5 runs, the public code one step. The minimum is the best case, which a loaded machine
(two cores shared by the cluster's processes) rarely gives; the mean is pulled by the
outliers we do see (first-run kernel initialisation, a step preempted by another
process). The median is the typical time and ignores up to half the steps being outliers.

TensorFlow is imported inside the functions that need it.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import tempfile
from typing import Any, Callable, Iterable, Mapping, Sequence

from tictac_hooks.graph.dag import GraphError
from tictac_hooks.graph.oracle import TransferRecord, _reduce
from tictac_hooks.graph.tf.naming import sending_node_name, task_of

RECV_TENSOR = "RecvTensor"
STEP_MARKER = "tictac_step"
_LABEL_BYTES = re.compile(r"^\[(\d+)B\]")
_LABEL_EDGE = re.compile(r"\s(edge_\d+_\S+)\s+from\s+(\S+)\s+to\s+(\S+)")


# --- graph mode: step_stats ---------------------------------------------------------

def _step_stats_list(step_stats_list: Any) -> list[Any]:
    """Accepts StepStats, RunMetadata, or a list of either."""
    items = step_stats_list if isinstance(step_stats_list, (list, tuple)) else [step_stats_list]
    out = []
    for item in items:
        if hasattr(item, "step_stats"):
            item = item.step_stats
        if not hasattr(item, "dev_stats"):
            raise GraphError("expected StepStats or RunMetadata protos, got "
                             f"{type(item).__name__}")
        out.append(item)
    if not out:
        raise GraphError("no step_stats given")
    return out


def _kernel_seconds(ns: Any) -> float:
    """Kernel time of one NodeExecStats: op_end - op_start (ns resolution if present).

    Not all_end: for an asynchronous kernel (a _Recv) that includes waiting for the
    data, which is transfer time, not compute.
    """
    if ns.op_end_rel_nanos or ns.op_start_rel_nanos:
        return max(0, ns.op_end_rel_nanos - ns.op_start_rel_nanos) * 1e-9
    if ns.op_end_rel_micros or ns.op_start_rel_micros:
        return max(0, ns.op_end_rel_micros - ns.op_start_rel_micros) * 1e-6
    return max(0, ns.all_end_rel_nanos or ns.all_end_rel_micros * 1000) * 1e-9


def times_from_step_stats(step_stats_list: Any, name_map: Mapping[str, str] | None = None,
                          statistic: str = "median",
                          device: str | None = None) -> dict[str, float]:
    """Per-op compute times from graph-mode step_stats of N steps.

    Args:
      step_stats_list: ``StepStats`` (or ``RunMetadata``) protos, one per profiled step
        (``RunOptions(trace_level=FULL_TRACE)``).
      name_map: node name -> DAG op name (``Extraction.name_map``); others keep their
        node name.
      statistic: ``"median"`` (default, see the module docstring), ``"min"`` or
        ``"mean"`` over the steps.
      device: keep only devices whose name contains this (e.g.
        ``"/job:worker/replica:0/task:0"``); the PS's own nodes (its variable reads
        are named like the recvs) are otherwise included.

    Returns:
      op name -> seconds. Per step, an op's time is the sum of its kernel times
      (``op_end_rel`` - ``op_start_rel``) on the kept devices; an op missing from a step
      counts 0 there. ``RecvTensor`` transfer records and ``_SOURCE`` are skipped (see
      :func:`transfers_from_step_stats`).
    """
    steps = _step_stats_list(step_stats_list)
    name_map = name_map or {}
    per_step: list[dict[str, float]] = []
    for ss in steps:
        totals: dict[str, float] = {}
        for dev in ss.dev_stats:
            if device is not None and device not in dev.device:
                continue
            for ns in dev.node_stats:
                if ns.node_name in (RECV_TENSOR, "_SOURCE"):
                    continue
                name = name_map.get(ns.node_name, ns.node_name)
                totals[name] = totals.get(name, 0.0) + _kernel_seconds(ns)
        per_step.append(totals)
    names = {n for totals in per_step for n in totals}
    samples = {n: [totals.get(n, 0.0) for totals in per_step] for n in names}
    return _reduce(samples, statistic)


def transfers_from_step_stats(step_stats_list: Any, destination: str | None = None,
                              source: str | None = None) -> list[TransferRecord]:
    """The ``RecvTensor`` records of graph-mode step_stats (worker-side RPC timings).

    The timeline label reads ``[<bytes>B] [<rate>] edge_<n>_<sending node> from <src>
    to <dst>``; the name is the sending node (as in
    :func:`tictac_hooks.graph.tf.partition.extract_partition_graphs`), the time
    ``all_end_rel``: from issuing the RPC to the tensor's arrival. The PS's own pulls
    of gradients from the worker are records too: ``destination="worker:0"`` (or
    ``source="ps:0"``; a task or device string) keeps the parameter transfers to one
    worker.
    """
    want_dst = task_of(destination) or destination if destination else None
    want_src = task_of(source) or source if source else None

    out = []
    for ss in _step_stats_list(step_stats_list):
        for dev in ss.dev_stats:
            for ns in dev.node_stats:
                if ns.node_name != RECV_TENSOR:
                    continue
                m = _LABEL_EDGE.search(ns.timeline_label)
                if not m:
                    continue
                src, dst = task_of(m.group(2)), task_of(m.group(3))
                if (want_dst and dst != want_dst) or (want_src and src != want_src):
                    continue
                b = _LABEL_BYTES.match(ns.timeline_label)
                seconds = (ns.all_end_rel_nanos * 1e-9 if ns.all_end_rel_nanos
                           else ns.all_end_rel_micros * 1e-6)
                out.append(TransferRecord(sending_node_name(m.group(1)),
                                          int(b.group(1)) if b else None, seconds,
                                          src, dst))
    return out


# --- TF2: profiler ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ComputeProfile:
    """Per-op compute times measured with the TensorFlow profiler.

    Attributes:
      times: graph node name -> seconds (statistic over steps) for profiled nodes
        that are in the function's graph.
      coverage: matched profiled op time / all profiled op time, in [0, 1]. Below 1
        when the runtime ran ops not in the traced graph (grappler's fused or
        rewritten nodes get new names; a fused node keeps the name of the last node it
        replaces, so most time stays matched).
      steps: number of profiled steps.
      unmatched: profiled op names not in the graph, with their seconds (statistic).
    """

    times: dict[str, float]
    coverage: float
    steps: int
    unmatched: dict[str, float]


def profile_compute_times(fn: Any, args: Sequence[Any] = (), steps: int = 5,
                          warmup: int = 2, names: Iterable[str] | None = None,
                          statistic: str = "median",
                          progress: Callable[[int, int], None] | None = None
                          ) -> ComputeProfile:
    """Runs ``fn(*args)`` ``steps`` times under ``tf.profiler.experimental`` and reads
    the per-op kernel times from the xplane file.

    Args:
      fn: a ``tf.function`` or concrete function.
      args: its arguments.
      steps: profiled steps; warmup: unprofiled runs before (first-run costs).
      names: the graph node names to match; default: the ops of ``fn``'s graph.
      statistic: over steps, see the module docstring.
      progress: called with (done, total) after each run.

    Op events are the host plane's TraceMe events named ``<node name>:<op type>``;
    each is assigned to the step (our ``Trace("tictac_step")`` window) it ran in.
    The trace format is read by ``patches/tf_profiler.py``.
    Per step an op's time is the sum of its events; missing in a step counts 0.
    A node that grappler added while rewriting graph node ``n`` (named
    ``n/<Name>Optimizer/...``) counts for ``n``.
    """
    import tensorflow as tf
    from tictac_hooks.patches import tf_profiler

    if steps < 1 or warmup < 0:
        raise GraphError(f"steps must be >= 1 and warmup >= 0, got {steps}, {warmup}")
    if names is None:
        graph = getattr(fn, "graph", None)
        if graph is None:
            graph = fn.get_concrete_function(*args).graph
        names = [op.name for op in graph.get_operations()]
    known = set(names)
    total = warmup + steps
    for i in range(warmup):
        fn(*args)
        if progress:
            progress(i + 1, total)
    logdir = tempfile.mkdtemp(prefix="tictac_prof_")
    try:
        tf.profiler.experimental.start(logdir)
        try:
            for i in range(steps):
                with tf.profiler.experimental.Trace(STEP_MARKER, step_num=i, _r=1):
                    out = fn(*args)
                    _block(out)
                if progress:
                    progress(warmup + i + 1, total)
        finally:
            tf.profiler.experimental.stop()
        files = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        if not files:
            raise GraphError(f"the profiler wrote no .xplane.pb under {logdir}")
        space = tf_profiler.read_xspace(files[0])
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    per_step = [_attribute_rewrites(totals, known)
                for totals in _op_times_per_step(space, steps)]
    all_names = {n for totals in per_step for n in totals}
    samples = {n: [totals.get(n, 0.0) for totals in per_step] for n in all_names}
    reduced = _reduce(samples, statistic)
    matched = {n: t for n, t in reduced.items() if n in known}
    unmatched = {n: t for n, t in reduced.items() if n not in known}
    matched_total = sum(sum(t for n, t in totals.items() if n in known) for totals in per_step)
    all_total = sum(sum(totals.values()) for totals in per_step)
    coverage = matched_total / all_total if all_total > 0 else 0.0
    return ComputeProfile(times=matched, coverage=coverage, steps=steps, unmatched=unmatched)


def measure_compute_times(fn: Any, args: Sequence[Any] = (), steps: int = 5,
                          warmup: int = 2, **kwargs: Any) -> dict[str, float]:
    """Node name -> seconds (median over ``steps``) of ``fn(*args)`` on this machine;
    see :func:`profile_compute_times` (which also reports the coverage)."""
    return profile_compute_times(fn, args, steps, warmup, **kwargs).times


_REWRITTEN = re.compile(r"^(.+?)/[A-Za-z]+Optimizer/")


def _attribute_rewrites(totals: dict[str, float], known: set[str]) -> dict[str, float]:
    """Gives the time of a node grappler created by rewriting a graph node
    (``<node>/ArithmeticOptimizer/AddOpsRewrite_...``) to that node."""
    out: dict[str, float] = {}
    for name, t in totals.items():
        m = _REWRITTEN.match(name) if name not in known else None
        if m and m.group(1) in known:
            name = m.group(1)
        out[name] = out.get(name, 0.0) + t
    return out


def _block(out: Any) -> None:
    """Waits for the outputs (eager execution may be asynchronous)."""
    import tensorflow as tf

    for t in tf.nest.flatten(out):
        if hasattr(t, "numpy"):
            t.numpy()


def _op_times_per_step(space: Any, steps: int) -> list[dict[str, float]]:
    """Per step: op node name -> summed kernel seconds, from an XSpace."""
    from tictac_hooks.patches import tf_profiler

    windows: list[tuple[int, int]] = []
    events: list[tuple[int, str, int]] = []       # (start ps, node name, duration ps)
    for kind, name, start, duration in tf_profiler.host_events(space, STEP_MARKER):
        if kind == "marker":
            windows.append((start, start + duration))
        else:
            events.append((start, name, duration))
    if len(windows) != steps:
        raise GraphError(f"profiler trace has {len(windows)} step windows, expected {steps}")
    windows.sort()
    per_step: list[dict[str, float]] = [{} for _ in windows]
    for start, name, dur in events:
        for i, (lo, hi) in enumerate(windows):
            if lo <= start <= hi:
                per_step[i][name] = per_step[i].get(name, 0.0) + dur * 1e-12
                break
    return per_step
