"""A model replayed at GPU speed (`tictac bench --emulate-gpu`): the worker step of a
profile (graph/profile.py) with its parameters on the PSes and its compute emulated.

:func:`plan` turns a profile into a :class:`Replay`:

- **Parameters** placed as ParameterServerStrategy places them (graph/profile.py
  ``placed``: round-robin in creation order, MinSizePartitioner shards), each shard a
  variable of its real bytes times ``byte_scale`` (float32, flat: a profile keeps
  bytes, not shapes), read once per step by each worker (one transfer, as TensorFlow
  reads a variable once per step however many ops consume it).
- **Compute** as delay ops on the profile's own dependency structure: the compute ops
  in topological order, cut where an op first needs a parameter not yet read, so each
  segment waits for exactly the reads it needs; adjacent segments merged (the
  smallest pair first) down to ``max_ops``, so a step costs few ops of CPU; each
  segment's time is its ops' profiled time scaled so the step sums to ``compute_ms``.
  The segments run one after the other on the worker's stream (bench/emulate.py), as
  kernels on one GPU. Inference replays the forward ops alone (those that do not
  depend on the labels, ``y``).
- **Merged reads** (optional, the bench's default): the parameters a segment first
  needs from one PS as one variable, so a step costs fewer RPCs; the order then ranks
  these groups, each in the place of its first consumer.
- **Pushes** (training): each trained shard's gradient, of its push bytes times
  ``byte_scale``, leaves the worker when its compute ends (as ``tictac whatif``
  models it) and is applied on its PS.

:func:`build` makes the TensorFlow graph the bench runs: the same towers, timestamps
and compute reference as bench/workloads.py builds for a real model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from tictac_hooks.graph.dag import RECV, Graph
from tictac_hooks.graph.profile import Profile, ProfileError, placed

FLOAT_BYTES = 4
LABELS = "y"  # the profile's label input: what only the loss and backward depend on


@dataclasses.dataclass(frozen=True)
class Shard:
    """One PS variable of the replay."""

    name: str          # the parameter's name, with /part_<k> where it is sharded
    ps: int
    elements: int      # float32 elements (bytes x byte_scale / 4)
    push_elements: int  # its gradient's elements per step (0: not pushed)

    @property
    def partial_push(self) -> bool:
        """A push smaller than its variable (rows of a table, or rounding): it updates
        the leading ``push_elements`` elements, as rows would."""
        return 0 < self.push_elements < self.elements


@dataclasses.dataclass(frozen=True)
class Segment:
    """A delay op: ``ms`` of compute, after the reads it needs first."""

    ms: float
    reads: tuple[int, ...]  # indices into Replay.shards
    ops: int               # profile ops it stands for


@dataclasses.dataclass(frozen=True)
class Replay:
    model: str
    training: bool
    ps: int
    shards: tuple[Shard, ...]
    segments: tuple[Segment, ...]
    compute_ms: float
    byte_scale: float

    @property
    def pull_bytes(self) -> int:
        """Bytes one worker pulls per step."""
        return sum(s.elements for s in self.shards) * FLOAT_BYTES

    @property
    def push_bytes(self) -> int:
        return sum(s.push_elements for s in self.shards) * FLOAT_BYTES

    def describe(self) -> str:
        return (f"{self.model} replayed: {len(self.segments)} delay ops "
                f"(of {sum(s.ops for s in self.segments)} profiled ops) summing to "
                f"{sum(s.ms for s in self.segments):.1f} ms, {len(self.shards)} variables "
                f"on {self.ps} PS, {self.pull_bytes / 2**20:.1f} MiB pulled and "
                f"{self.push_bytes / 2**20:.1f} MiB pushed per worker step "
                f"(bytes x {self.byte_scale:g})")


def _forward(graph: Graph) -> set[str]:
    """The ops that do not depend on the labels."""
    if LABELS not in graph:
        return {op.name for op in graph.ops}
    tainted = {LABELS}
    for op in graph.ops:  # topological
        if any(i in tainted for i in op.inputs):
            tainted.add(op.name)
    return {op.name for op in graph.ops if op.name not in tainted}


def _merge(segments: list[Segment], max_ops: int) -> list[Segment]:
    """Adjacent segments merged, the pair with the least time first, down to
    ``max_ops`` (a merged segment waits for both halves' reads at its start)."""
    segs = list(segments)
    while len(segs) > max_ops:
        i = min(range(len(segs) - 1), key=lambda k: segs[k].ms + segs[k + 1].ms)
        a, b = segs[i], segs[i + 1]
        segs[i:i + 2] = [Segment(a.ms + b.ms, a.reads + b.reads, a.ops + b.ops)]
    return segs


def plan(profile: Profile, ps: int, compute_ms: float, training: bool = True,
         byte_scale: float = 1.0, max_ops: int = 64, merge_reads: bool = False) -> Replay:
    """The replay of ``profile`` on ``ps`` PSes (module docstring). ``merge_reads``:
    the parameters a segment first needs from one PS become one variable, read in one
    transfer (ResNet-50 on 4 PS: 416 reads a step become about 150), since at 16-32
    workers the RPCs' own CPU, not their bytes, is what a 2-core machine runs out of."""
    if not compute_ms > 0:
        raise ValueError(f"compute_ms must be > 0, got {compute_ms}")
    if not 0 < byte_scale <= 1:
        raise ValueError(f"byte_scale must be in (0, 1], got {byte_scale}")
    if max_ops < 1:
        raise ValueError(f"max_ops must be >= 1, got {max_ops}")
    if training and not profile.training:
        raise ProfileError(f"the {profile.model} profile holds no backward pass: replay "
                           "it for inference")
    where = placed(profile, ps)
    graph = where.graph
    keep = {op.name for op in graph.ops} if training else _forward(graph)
    pushes = {p.name: p.push_bytes for p in profile.parameters}
    # one variable per (parameter, PS): the placed recvs of one shard share it
    index: dict[tuple[str, str], int] = {}
    shards: list[Shard] = []
    shard_of: dict[str, int] = {}
    for op in graph.recvs:
        key = (op.param or op.name, op.channel or "ps:0")
        if key not in index:
            count = sum(1 for k in index if k[0] == key[0]) + 1
            nbytes = op.bytes or 0  # (every read of a shard carries the shard's bytes)
            index[key] = len(shards)
            n_shards = len({o.channel for o in graph.recvs if (o.param or o.name) == key[0]})
            name = key[0] if n_shards == 1 else f"{key[0]}/part_{count - 1}"
            push = pushes.get(key[0], 0) // n_shards if training else 0
            elements = max(1, round(nbytes * byte_scale / FLOAT_BYTES))
            shards.append(Shard(name, int(key[1].split(":")[1]), elements,
                                min(elements, round(push * byte_scale / FLOAT_BYTES))))
        shard_of[op.name] = index[key]
    ops = [op for op in graph.compute_ops if op.name in keep]
    total_s = sum(op.time or 0.0 for op in ops)
    if total_s <= 0:
        raise ProfileError(f"the {profile.model} profile has no compute times to scale "
                           f"to {compute_ms} ms")
    scale = compute_ms / (total_s * 1e3)
    segments: list[Segment] = []
    read: set[int] = set()
    for op in ops:
        new = tuple(sorted({shard_of[i] for i in op.inputs if i in shard_of} - read))
        ms = (op.time or 0.0) * 1e3 * scale
        if new or not segments:
            segments.append(Segment(ms, new, 1))
            read.update(new)
        else:
            last = segments[-1]
            segments[-1] = Segment(last.ms + ms, last.reads, last.ops + 1)
    # a segment of no time (ops before the first read that cost nothing, say the
    # inputs) goes into the next one: a delay op costs CPU even when it waits 0 ms
    timed: list[Segment] = []
    carry: Segment | None = None
    for seg in segments:
        if carry is not None:
            seg = Segment(carry.ms + seg.ms, carry.reads + seg.reads, carry.ops + seg.ops)
            carry = None
        if seg.ms <= 0:
            carry = seg
        else:
            timed.append(seg)
    if carry is not None and timed:
        last = timed[-1]
        timed[-1] = Segment(last.ms, last.reads + carry.reads, last.ops + carry.ops)
    segments = timed
    # a shard no kept op reads (inference: a backward-only read) is not pulled
    used = sorted({r for s in segments for r in s.reads})
    renumber = {old: new for new, old in enumerate(used)}
    shards = [shards[i] for i in used]
    segments = [Segment(s.ms, tuple(renumber[r] for r in s.reads), s.ops) for s in segments]
    segments = _merge(segments, max_ops)
    if merge_reads:
        shards, segments = _merged_reads(shards, segments)
    return Replay(profile.model, training, ps, tuple(shards), tuple(segments),
                  float(compute_ms), float(byte_scale))


def _merged_reads(shards: list[Shard], segments: list[Segment]
                  ) -> tuple[list[Shard], list[Segment]]:
    """One variable per (segment, PS): the shards a segment first needs from one PS,
    as one transfer of their bytes together (and one push of their gradients)."""
    out: list[Shard] = []
    merged: list[Segment] = []
    for i, seg in enumerate(segments):
        by_ps: dict[int, list[Shard]] = {}
        for r in seg.reads:
            by_ps.setdefault(shards[r].ps, []).append(shards[r])
        reads = []
        for p, group in sorted(by_ps.items()):
            reads.append(len(out))
            out.append(Shard(f"segment_{i}/ps_{p}", p, sum(g.elements for g in group),
                             sum(g.push_elements for g in group)))
        merged.append(Segment(seg.ms, tuple(reads), seg.ops))
    return out, merged


def build(replay: Replay, worker_sets: Sequence[Sequence[int]], learning_rate: float = 1e-3,
          compute_workers: Sequence[int] = ()) -> Any:
    """The bench's graph for ``replay`` (a bench/workloads.py ``Workload``): the
    variables on the PS tasks, per worker set one tower per worker task, and with
    ``compute_workers`` the compute reference (the same delays, no transfer)."""
    import tensorflow as tf

    from tictac_hooks.bench import emulate
    from tictac_hooks.bench.workloads import TowerSet, Workload
    emulate.ops()
    graph = tf.Graph()
    with graph.as_default():
        variables = []
        for s in replay.shards:
            with tf.device(f"/job:ps/task:{s.ps}"):
                variables.append(tf.compat.v1.get_variable(
                    s.name.replace(":", "_"), shape=[s.elements], dtype=tf.float32,
                    initializer=tf.compat.v1.zeros_initializer(), use_resource=True))

        def tower(reads: Sequence[Any] | None) -> tuple[Any, list[Any], Any]:
            # the step starts from a timestamp: nothing here is a constant to fold
            start = tf.timestamp()
            act = tf.cast(start, tf.float32)
            for seg in replay.segments:
                inputs = [act] + ([reads[r] for r in seg.reads] if reads is not None else [])
                act = emulate.delay(inputs, seg.ms)[0]
            grads = []
            if replay.training and reads is not None:
                grads = [emulate.payload([act], [s.push_elements]) if s.push_elements
                         else None for s in replay.shards]
            return act, grads, start

        compute = None
        if compute_workers:
            outs, starts, stamps = [], [], []
            for w in compute_workers:
                with tf.device(f"/job:worker/task:{w}"), tf.name_scope(f"compute{w}"):
                    act, _, start = tower(None)
                    with tf.control_dependencies([act]):
                        stamps.append(tf.timestamp())
                    outs.append(act)
                    starts.append(start)
            # each worker's start and finish on its own clock (compute_spans)
            compute = TowerSet(list(compute_workers), outs + starts + stamps, len(stamps),
                               spans=True)
        sets = []
        for tasks in worker_sets:
            outs, stamps, tower_grads = [], [], []
            for w in tasks:
                with tf.device(f"/job:worker/task:{w}"), tf.name_scope(f"tower{w}"):
                    reads = [v.read_value() for v in variables]
                    act, grads, _ = tower(reads)
                    tower_grads.append(grads)
                    outs.append(act)
                    with tf.control_dependencies([act] + [g for g in grads if g is not None]):
                        stamps.append(tf.timestamp())
            fetches: list[Any] = list(outs)
            if replay.training:
                updates = []
                for i, var in enumerate(variables):
                    grads_i = [g[i] for g in tower_grads if g and g[i] is not None]
                    if grads_i:
                        with tf.compat.v1.colocate_with(var):
                            step = learning_rate * tf.add_n(grads_i) / float(len(grads_i))
                            shard = replay.shards[i]
                            updates.append(
                                var.scatter_sub(tf.IndexedSlices(
                                    step, tf.range(shard.push_elements))).op
                                if shard.partial_push else var.assign_sub(step).op)
                fetches.append(tf.group(*updates))
            sets.append(TowerSet(list(tasks), fetches + stamps, len(stamps)))
        init = tf.compat.v1.global_variables_initializer()
    return Workload(graph, init, sets, variables, replay.pull_bytes, list(variables),
                    compute, list(variables))
