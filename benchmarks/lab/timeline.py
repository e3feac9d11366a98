"""One worker's step, read from its trace: where the step's time goes.

A ``FULL_TRACE`` step of a graph-mode PS cluster (``RunMetadata.step_stats``, with
``output_partition_graphs``) holds, on one clock (every task on one machine):

- each op the worker ran (its device's ``node_stats``: ``all_start`` and the kernel's
  ``op_start_rel`` .. ``op_end_rel``);
- each pull (a ``RecvTensor`` record on the worker's device, label ``[<bytes>B] ...
  edge_<n>_<sending node> from <ps> to <worker>``): issued at ``all_start``, arrived
  at ``all_start + all_end_rel``;
- each push (in training the gradients: the PS's ``RecvTensor`` records from the
  worker), which the PS asks for at the start of the step and the worker answers once
  the gradient is computed, so it is on the wire from the later of the two;
- the PS's own ops (its update).

:func:`read_step` turns one step's ``step_stats`` into a :class:`StepTrace` (absolute
seconds), :func:`partition_inputs` reads from the partition graphs which worker node
is a ``_Recv`` of which tensor and what each node takes, and :func:`analyze` says
when compute starts against the first pull, when each forward convolution or matmul
starts against its weights' arrival (the wait its transfer caused), how long the
compute device was busy and how long it idled while pulls were still on the way, and
where the pushes go against the backward pass. :func:`gate_vs_worker` sets the PS
gate's records (when it handed each transfer back) beside the worker's arrivals.
Every time in their results is in milliseconds from the step's start (the earliest
event of the trace). No TensorFlow here: the protos are read by attribute, so a test
hands in plain objects.

Used by ``benchmarks/probe_step_timeline.py``.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from typing import Any, Iterable, Mapping, Sequence

from tictac_hooks.graph.tf.naming import sending_node_name, task_of

RECV_TENSOR = "RecvTensor"
# "[4B]", "[1.0MB]": TensorFlow's human-readable size (powers of 1024), so the larger
# ones are rounded to 2 or 3 digits (the gate's records hold the exact bytes)
_LABEL_BYTES = re.compile(r"^\[(\d+(?:\.\d+)?)([KMGT]?)i?B\]")
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_LABEL_EDGE = re.compile(r"\s(edge_\d+_\S+)\s+from\s+(\S+)\s+to\s+(\S+)")
_LABEL_OP = re.compile(r"^(?:\[[^\]]*\]\s*)*\S+\s*=\s*([A-Za-z0-9_]+)\(")
# worker nodes that move data rather than compute
TRANSFER_OPS = frozenset({"_Recv", "_Send", "_HostRecv", "_HostSend", "_Retval", "_Arg"})
# ops a kernel passes through on its way from the _Recv to its convolution or matmul
PASS_THROUGH_OPS = frozenset({"Identity", "Cast", "_MklToTf", "_MklIdentity", "Reshape",
                              "ReadVariableOp"})
# ops that compute nothing (a gradient's constants run at the step's start)
TRIVIAL_OPS = frozenset({"Const", "NoOp", "HostConst"})
GRADIENTS = re.compile(r"(^|/)gradients(_\d+)?/")


@dataclasses.dataclass(frozen=True)
class NodeRun:
    """One op's kernel on a device: absolute seconds."""

    name: str
    op: str       # its op type ("" where the trace does not say)
    start: float  # op_start
    end: float    # op_end


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One RecvTensor: asked for at ``start``, arrived at ``end`` (absolute seconds)."""

    tensor: str   # edge_<n>_<sending node>
    src: str      # task, e.g. "ps:0"
    dst: str
    bytes: int | None
    start: float
    end: float

    @property
    def name(self) -> str:
        """The sending node (what the gate and the schedules call the transfer)."""
        return sending_node_name(self.tensor)


@dataclasses.dataclass(frozen=True)
class StepTrace:
    """One traced step as :func:`read_step` reads it."""

    start: float                    # the earliest event of the step
    end: float                      # the latest end of an event
    compute: tuple[NodeRun, ...]    # the worker's ops (no transfer ops)
    pulls: tuple[Transfer, ...]     # PS -> the worker
    pushes: tuple[Transfer, ...]    # the worker -> a PS
    ps_ops: tuple[NodeRun, ...]     # the PSes' ops


def _abs_start(ns: Any) -> float:
    if getattr(ns, "all_start_nanos", 0):
        return ns.all_start_nanos * 1e-9
    return ns.all_start_micros * 1e-6


def _rel(ns: Any, field: str) -> float:
    nanos = getattr(ns, f"{field}_rel_nanos", 0)
    return nanos * 1e-9 if nanos else getattr(ns, f"{field}_rel_micros", 0) * 1e-6


def _op_type(label: str) -> str:
    m = _LABEL_OP.match(label or "")
    return m.group(1) if m else ""


def label_bytes(label: str) -> int | None:
    """The size a RecvTensor record's label gives (``[1.0MB] ...``), or None."""
    m = _LABEL_BYTES.match(label or "")
    return round(float(m.group(1)) * _UNIT[m.group(2)]) if m else None


def read_step(step_stats: Any, worker: str = "worker:0") -> StepTrace:
    """The ops and transfers of ``worker`` (a task, ``"worker:0"``) in one step's
    ``step_stats`` (a ``StepStats`` or ``RunMetadata``)."""
    step_stats = getattr(step_stats, "step_stats", step_stats)
    starts, ends = [], []
    compute, pulls, pushes, ps_ops = [], [], [], []
    for dev in step_stats.dev_stats:
        task = task_of(dev.device)
        for ns in dev.node_stats:
            t0 = _abs_start(ns)
            starts.append(t0)
            ends.append(t0 + max(_rel(ns, "all_end"), _rel(ns, "op_end")))
            if ns.node_name == RECV_TENSOR:
                m = _LABEL_EDGE.search(ns.timeline_label)
                if not m:
                    continue
                t = Transfer(m.group(1), task_of(m.group(2)) or "", task_of(m.group(3)) or "",
                             label_bytes(ns.timeline_label), t0, t0 + _rel(ns, "all_end"))
                if t.dst == worker and t.src.startswith("ps:"):
                    pulls.append(t)
                elif t.src == worker and t.dst.startswith("ps:"):
                    pushes.append(t)
                continue
            if ns.node_name == "_SOURCE":
                continue
            op = _op_type(ns.timeline_label)
            run = NodeRun(ns.node_name, op, t0 + _rel(ns, "op_start"), t0 + _rel(ns, "op_end"))
            if task == worker and op not in TRANSFER_OPS:
                compute.append(run)
            elif task and task.startswith("ps:") and op not in TRANSFER_OPS:
                ps_ops.append(run)
    if not starts:
        raise ValueError("the step_stats hold no event")
    return StepTrace(min(starts), max(ends), tuple(compute), tuple(pulls), tuple(pushes),
                     tuple(ps_ops))


@dataclasses.dataclass(frozen=True)
class Partition:
    """What the worker's partition graph says: each node's inputs and op type, and the
    tensor (edge_<n>_...) each ``_Recv`` node receives."""

    inputs: Mapping[str, tuple[str, ...]]
    ops: Mapping[str, str]
    recv_tensor: Mapping[str, str]


def partition_inputs(partition_graphs: Iterable[Any], worker: str = "worker:0") -> Partition:
    """:class:`Partition` of ``worker``'s nodes in the step's partition graphs
    (``RunMetadata.partition_graphs``)."""
    inputs, ops, recv = {}, {}, {}
    for graph_def in partition_graphs:
        for node in graph_def.node:
            if task_of(node.device) != worker:
                continue
            inputs[node.name] = tuple(i.split(":")[0].lstrip("^") for i in node.input)
            ops[node.name] = node.op
            if node.op in ("_Recv", "_HostRecv") and "tensor_name" in node.attr:
                recv[node.name] = node.attr["tensor_name"].s.decode()
    return Partition(inputs, ops, recv)


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _measure(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _minus(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]
           ) -> list[tuple[float, float]]:
    """The union ``a`` less the union ``b`` (both sorted and disjoint)."""
    out = []
    for lo, hi in a:
        cur = lo
        for x, y in b:
            if y <= cur or x >= hi:
                continue
            if x > cur:
                out.append((cur, x))
            cur = max(cur, y)
            if cur >= hi:
                break
        if cur < hi:
            out.append((cur, hi))
    return out


def is_forward_kernel_op(run: NodeRun) -> bool:
    """A convolution or matmul of the forward pass (its op type says Conv2D or MatMul,
    fused or not; no gradient)."""
    op = run.op or ""
    return (("Conv2D" in op or "MatMul" in op) and "Backprop" not in op
            and not GRADIENTS.search(run.name))


def _kernel_recvs(name: str, part: Partition, depth: int = 3) -> list[str]:
    """The received tensors a node takes directly or through pass-through ops."""
    out = []
    for i in part.inputs.get(name, ()):
        if i in part.recv_tensor:
            out.append(part.recv_tensor[i])
        elif depth > 0 and part.ops.get(i) in PASS_THROUGH_OPS:
            out += _kernel_recvs(i, part, depth - 1)
    return out


def _ms(t: float | None, origin: float) -> float | None:
    return None if t is None else round((t - origin) * 1e3, 3)


def analyze(trace: StepTrace, part: Partition | None = None,
            wall_s: float | None = None) -> dict[str, Any]:
    """The step's timeline, milliseconds from ``trace.start`` (see the module
    docstring); ``part`` (the worker's partition) ties each forward op to its
    weights' pull; ``wall_s`` is the client's measure of the step."""
    t0 = trace.start
    ms = lambda t: _ms(t, t0)  # noqa: E731
    runs = {r.name: r for r in trace.compute}
    arrival = {p.tensor: p.end for p in trace.pulls}
    busy = _union((r.start, r.end) for r in trace.compute)
    pulling = _union((p.start, p.end) for p in trace.pulls)
    first_compute = min((r.start for r in trace.compute), default=None)
    last_compute = max((r.end for r in trace.compute), default=None)
    span = [(first_compute, last_compute)] if trace.compute else []
    out: dict[str, Any] = {
        "wall_ms": None if wall_s is None else round(wall_s * 1e3, 3),
        "trace_span_ms": ms(trace.end),
        "pulls": {
            "count": len(trace.pulls),
            "bytes": sum(p.bytes or 0 for p in trace.pulls),
            "first_issued_ms": ms(min((p.start for p in trace.pulls), default=None)),
            "first_arrival_ms": ms(min((p.end for p in trace.pulls), default=None)),
            "last_arrival_ms": ms(max((p.end for p in trace.pulls), default=None)),
        },
        "compute": {
            "ops": len(trace.compute),
            "first_start_ms": ms(first_compute),
            "last_end_ms": ms(last_compute),
            # the union of the kernels' intervals (ops run in parallel on inter-op threads)
            "busy_ms": round(_measure(busy) * 1e3, 3),
            # the kernels' times added up (above busy_ms where ops overlapped)
            "kernel_sum_ms": round(sum(r.end - r.start for r in trace.compute) * 1e3, 3),
            "idle_ms": round(_measure(_minus(span, busy)) * 1e3, 3),
            # no kernel running while some pull was on the way
            "idle_waiting_for_pulls_ms": round(_measure(_minus(pulling, busy)) * 1e3, 3),
            "idle_before_last_pull_ms": round(_measure(_minus(
                [(t0, max((p.end for p in trace.pulls), default=t0))], busy)) * 1e3, 3),
        },
    }
    forward = []
    for run in sorted((r for r in trace.compute if is_forward_kernel_op(r)),
                      key=lambda r: r.start):
        kernels = _kernel_recvs(run.name, part) if part else []
        arrive = max((arrival[k] for k in kernels if k in arrival), default=None)
        # its data: the inputs that are not its weights (nor their pass-through ops)
        data = [runs[i].end for i in (part.inputs.get(run.name, ()) if part else ())
                if i in runs and not (part.ops.get(i) in PASS_THROUGH_OPS
                                      and _kernel_recvs(i, part))]
        data_ready = max(data, default=t0)
        wait = max(0.0, min(arrive, run.start) - data_ready) if arrive is not None else 0.0
        forward.append({"name": run.name, "op": run.op, "start_ms": ms(run.start),
                        "end_ms": ms(run.end), "kernels": [sending_node_name(k)
                                                           for k in kernels],
                        "weights_arrival_ms": ms(arrive), "data_ready_ms": ms(data_ready),
                        "wait_for_weights_ms": round(wait * 1e3, 3)})
    convs = [f for f in forward if "Conv2D" in f["op"]]
    matmuls = [f for f in forward if "MatMul" in f["op"]]
    out["forward"] = {
        "ops": forward,
        "conv_first_start_ms": min((f["start_ms"] for f in convs), default=None),
        "conv_last_end_ms": max((f["end_ms"] for f in convs), default=None),
        "matmul_first_start_ms": min((f["start_ms"] for f in matmuls), default=None),
        "matmul_last_end_ms": max((f["end_ms"] for f in matmuls), default=None),
        "wait_for_weights_ms": round(sum(f["wait_for_weights_ms"] for f in forward), 3),
        "ops_that_waited": sum(1 for f in forward if f["wait_for_weights_ms"] > 0),
        "ops_with_weights_known": sum(1 for f in forward if f["weights_arrival_ms"] is not None),
    }
    backward = [r for r in trace.compute if GRADIENTS.search(r.name)
                and r.op not in TRIVIAL_OPS]
    out["backward"] = {
        "ops": len(backward),
        "first_start_ms": ms(min((r.start for r in backward), default=None)),
        "last_end_ms": ms(max((r.end for r in backward), default=None)),
    }
    pushes = []
    back_end = max((r.end for r in backward), default=None)
    for p in sorted(trace.pushes, key=lambda p: p.end):
        producer = runs.get(p.name)
        # the PS asks at the step's start; the tensor leaves once its node has run
        leaves = max(p.start, producer.end) if producer else p.start
        pushes.append({"name": p.name, "bytes": p.bytes, "asked_ms": ms(p.start),
                       "produced_ms": ms(producer.end) if producer else None,
                       "leaves_ms": ms(leaves), "arrived_ms": ms(p.end)})
    big = [p for p in pushes if (p["bytes"] or 0) > 1024]
    out["pushes"] = {
        "count": len(pushes),
        "bytes": sum(p["bytes"] or 0 for p in pushes),
        "first_leaves_ms": min((p["leaves_ms"] for p in big), default=None),
        "first_arrived_ms": min((p["arrived_ms"] for p in big), default=None),
        "last_arrived_ms": max((p["arrived_ms"] for p in pushes), default=None),
        "arrived_before_backward_end": sum(1 for p in pushes
                                           if back_end is not None
                                           and p["arrived_ms"] <= ms(back_end)),
        "after_backward_end_ms": (round(max(p["arrived_ms"] for p in pushes)
                                        - ms(back_end), 3)
                                  if pushes and back_end is not None else None),
        "items": pushes,
    }
    out["ps"] = {
        "ops": len(trace.ps_ops),
        "last_end_ms": ms(max((r.end for r in trace.ps_ops), default=None)),
    }
    return out


def gate_vs_worker(gate_steps: Iterable[Any], trace: StepTrace, worker: str | None = None,
                   slack_s: float = 0.02) -> dict[str, Any] | None:
    """The gate's records of this step (each ``GateStep`` of ``worker``, a task, any
    when None, whose first arrival falls in the step, ``slack_s`` before its start at
    the earliest: every task runs on one clock) beside
    the worker's arrivals: per transfer when its request reached the gate, when the PS
    had the response ready, when the gate released and handed it back, and when the
    worker saw it arrive (ms from the step's start); None where no record fits."""
    t0 = trace.start
    fits = [s for s in gate_steps if s.transfers
            and t0 - slack_s <= s.start <= trace.end
            and (worker is None or task_of(getattr(s, "worker", "")) in (worker, None))]
    if not fits:
        return None
    arrivals: dict[str, list[float]] = {}
    for p in trace.pulls:
        arrivals.setdefault(p.name, []).append(p.end)
        arrivals.setdefault(p.tensor, []).append(p.end)
    rows, lags = [], []
    for rec in fits:
        for t in rec.transfers:
            seen = arrivals.get(t.tensor or t.name) or arrivals.get(t.name)
            worker_arrival = min(seen) if seen else None
            lag = (worker_arrival - t.handback
                   if worker_arrival is not None and t.handback else None)
            if lag is not None:
                lags.append(lag)
            rows.append({"name": t.name, "bytes": t.bytes, "state": t.state,
                         "arrive_ms": _ms(t.arrive or None, t0),
                         "ready_ms": _ms(t.ready or None, t0),
                         "release_ms": _ms(t.release or None, t0),
                         "handback_ms": _ms(t.handback or None, t0),
                         "held_ms": round(t.held_s * 1e3, 3),
                         "ps_ms": round(t.ps_s * 1e3, 3),
                         "worker_arrival_ms": _ms(worker_arrival, t0),
                         "handback_to_arrival_ms": None if lag is None
                         else round(lag * 1e3, 3)})
    rows.sort(key=lambda r: (r["handback_ms"] is None, r["handback_ms"] or 0.0))
    handbacks = [r["handback_ms"] for r in rows if r["handback_ms"] is not None]
    return {
        "records": len(fits),
        "scheduled": any(getattr(s, "scheduled", False) for s in fits),
        "first_arrive_ms": min((r["arrive_ms"] for r in rows if r["arrive_ms"] is not None),
                               default=None),
        "first_handback_ms": min(handbacks, default=None),
        "last_handback_ms": max(handbacks, default=None),
        "held_total_ms": round(sum(r["held_ms"] for r in rows), 3),
        "handback_to_arrival_median_ms": round(statistics.median(lags) * 1e3, 3)
        if lags else None,
        "handback_to_arrival_max_ms": round(max(lags) * 1e3, 3) if lags else None,
        "transfers": rows,
    }


def median_of(timelines: Sequence[Mapping[str, Any]], *path: str) -> float | None:
    """The median over steps of one number of :func:`analyze`'s result (``path``: its
    keys), steps without it left out."""
    values = []
    for tl in timelines:
        v: Any = tl
        for key in path:
            v = v.get(key) if isinstance(v, Mapping) else None
        if isinstance(v, (int, float)):
            values.append(float(v))
    return round(statistics.median(values), 3) if values else None


SUMMARY_KEYS = {
    "wall_ms": ("wall_ms",),
    "first_pull_ms": ("pulls", "first_arrival_ms"),
    "last_pull_ms": ("pulls", "last_arrival_ms"),
    "compute_start_ms": ("compute", "first_start_ms"),
    "compute_end_ms": ("compute", "last_end_ms"),
    "busy_ms": ("compute", "busy_ms"),
    "kernel_sum_ms": ("compute", "kernel_sum_ms"),
    "idle_ms": ("compute", "idle_ms"),
    "idle_waiting_for_pulls_ms": ("compute", "idle_waiting_for_pulls_ms"),
    "conv_first_start_ms": ("forward", "conv_first_start_ms"),
    "conv_last_end_ms": ("forward", "conv_last_end_ms"),
    "matmul_first_start_ms": ("forward", "matmul_first_start_ms"),
    "matmul_last_end_ms": ("forward", "matmul_last_end_ms"),
    "forward_wait_for_weights_ms": ("forward", "wait_for_weights_ms"),
    "backward_start_ms": ("backward", "first_start_ms"),
    "backward_end_ms": ("backward", "last_end_ms"),
    "pushes_first_leave_ms": ("pushes", "first_leaves_ms"),
    "pushes_last_arrive_ms": ("pushes", "last_arrived_ms"),
    "pushes_after_backward_ms": ("pushes", "after_backward_end_ms"),
    "ps_last_op_end_ms": ("ps", "last_end_ms"),
    "first_tower_end_ms": ("first_tower_end_ms",),  # (last_to_finish's steps only)
}


def summarize(timelines: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Medians over steps of the numbers :func:`summary_text` reads."""
    return {k: median_of(timelines, *path) for k, path in SUMMARY_KEYS.items()}


def tower_end_ms(tl: Mapping[str, Any]) -> float | None:
    """When the worker's part of the step ended (ms): its backward pass's end in
    training, its last compute op's in inference."""
    end = (tl.get("backward") or {}).get("last_end_ms")
    return end if end is not None else (tl.get("compute") or {}).get("last_end_ms")


def last_to_finish(per_worker: Mapping[str, Sequence[Mapping[str, Any]]]
                   ) -> list[dict[str, Any]]:
    """Per traced step (the workers' lists run in step), the timeline of the worker
    whose tower ended last (:func:`tower_end_ms`), the one the synchronous step waits
    for, with ``worker`` set to it and ``first_tower_end_ms`` to the earliest worker's
    tower end (the straggler gap between them)."""
    lengths = {len(v) for v in per_worker.values()}
    if len(lengths) > 1:
        raise ValueError(f"the workers have different numbers of traced steps: {lengths}")
    out = []
    for i in range(lengths.pop() if lengths else 0):
        ends = {w: tower_end_ms(tls[i]) for w, tls in per_worker.items()}
        known = {w: e for w, e in ends.items() if e is not None}
        if not known:
            continue
        last = max(known, key=known.get)
        out.append(dict(per_worker[last][i], worker=last,
                        first_tower_end_ms=min(known.values())))
    return out


def summary_text(summaries: Mapping[str, Mapping[str, float | None]]) -> str:
    """One line per quantity, one column per order (order name -> :func:`summarize`)."""
    names = list(summaries)
    fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    lines = ["ms from the step's start (median over the traced steps): "
             + " | ".join(names)]
    for key in SUMMARY_KEYS:
        lines.append(f"  {key:28s} " + " | ".join(fmt(summaries[n].get(key)) for n in names))
    return "\n".join(lines)
