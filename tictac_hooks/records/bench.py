"""What the benchmark measures: each synchronous step (:class:`ClientStep`) and a
whole run's result (:class:`BenchRun`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from tictac_hooks.records._base import RecordError, _field, _floats, _optional


@dataclasses.dataclass(frozen=True)
class ClientStep:
    """One synchronous step as the benchmark client measured it.

    Attributes:
      schedule: the schedule the step ran under ("none", "rendezvous", "tic", ...).
      step_time: wall seconds of the step, as the client saw it.
      finishes: per worker, seconds from the step's start to that tower's finish.
    """

    schedule: str
    step_time: float
    finishes: tuple[float, ...]

    def straggler_pct(self) -> float:
        """Largest share (%) of the step any worker waits for the slowest."""
        if len(self.finishes) < 2 or self.step_time <= 0:
            return 0.0
        return 100.0 * (max(self.finishes) - min(self.finishes)) / self.step_time

    @property
    def makespan(self) -> float:
        """The step's makespan on the workers: the slowest tower's finish."""
        return max(self.finishes) if self.finishes else self.step_time

    def to_json(self) -> dict[str, Any]:
        return {"schedule": self.schedule, "step_time": self.step_time,
                "finishes": list(self.finishes)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ClientStep":
        f = lambda k: _field(d, k, "client step")  # noqa: E731
        return cls(f("schedule"), float(f("step_time")), tuple(float(x) for x in f("finishes")))


# --- Benchmark runs (`tictac bench`) -------------------------------------------------
#
# One run's result, as `tictac bench --json` writes it and `tictac bench-report` reads
# it: :class:`BenchRun` holds the configuration, the machine and network, and one
# :class:`RateRun` per link rate, each with a :class:`ScheduleSummary` per schedule.
# ``from_json`` reads every result written since the benchmark's first version: a field
# added later is optional and defaults (documented beside it); a field every version
# wrote is required, and a record without it is a :class:`RecordError`.


@dataclasses.dataclass(frozen=True)
class GateCounts:
    """What the gates recorded of one schedule's steps (bench/metrics.py
    ``rendezvous_counts``): a schedule through a gate has them, TensorFlow's default
    and "stock" (the gate bypassed) do not."""

    transfers: int                  # RecvTensor calls over every gate
    violations: int                 # late or unexpected transfers
    violation_pct: float | None     # their share of transfers (None: no transfer)
    skips: int
    matched: float | None           # share of scheduled transfers the order named
    reordered: int | None = None    # behind a later-listed one (None: older results)
    # what the PSes served a worker per step, median over steps (None: older results)
    bytes_per_worker_step: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "GateCounts":
        f = lambda k: _field(d, k, "gate counts")  # noqa: E731
        return cls(int(f("transfers")), int(f("violations")),
                   _optional(f("violation_pct"), float), int(f("skips")),
                   _optional(f("matched"), float), _optional(d.get("reordered"), int),
                   _optional(d.get("bytes_per_worker_step"), float))


@dataclasses.dataclass(frozen=True)
class UnscheduledTransfer:
    """A transfer an installed order did not name (bench/metrics.py
    ``unscheduled_transfers``)."""

    name: str
    bytes: int     # as last served
    steps: int     # scheduled steps it came in
    reason: str    # late, "in the DAG, not in the order", "not in the traced DAG"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "UnscheduledTransfer":
        f = lambda k: _field(d, k, "unscheduled transfer")  # noqa: E731
        return cls(str(f("name")), int(f("bytes")), int(f("steps")), str(f("reason")))


@dataclasses.dataclass(frozen=True)
class CheckSummary:
    """What schedule "checked" ran of TicTac's order check, and what it decided."""

    decision: str               # "tictac" or "default"
    kept: str | None            # the order kept (None: TensorFlow's)
    seconds: float              # the check's wall time
    steps: int                  # the check's steps
    candidates: Mapping[str, float | None]  # order -> median paired ratio to TF's order

    def to_json(self) -> dict[str, Any]:
        return {"decision": self.decision, "kept": self.kept, "seconds": self.seconds,
                "steps": self.steps, "candidates": dict(self.candidates)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CheckSummary":
        f = lambda k: _field(d, k, "order check")  # noqa: E731
        return cls(str(f("decision")), f("kept"), float(f("seconds")), int(f("steps")),
                   {str(k): _optional(v, float) for k, v in f("candidates").items()})


@dataclasses.dataclass(frozen=True)
class ScheduleSummary:
    """One schedule's steps at one link rate (bench/metrics.py ``summarize``). Times
    in seconds; see bench/metrics.py for the definitions."""

    steps: int
    throughput: float               # samples per second
    step_time_mean: float
    step_time_median: float
    step_time_p95: float
    step_time_cv: float
    straggler_pct: float            # mean over steps
    straggler_pct_p95: float
    efficiency_median: float | None  # measured E (None: no step bounded by the oracle)
    makespan_median: float
    efficiency_steps: int | None = None  # steps with an E (None: older results)
    efficiency_note: str | None = None   # why steps have no E
    gate: GateCounts | None = None       # None: no gate on the path (none, stock)
    # transfers the installed order left out, largest first (None: no order installed)
    unscheduled: tuple[UnscheduledTransfer, ...] | None = None
    check: CheckSummary | None = None    # schedule "checked" only

    _GATE = tuple(f.name for f in dataclasses.fields(GateCounts))

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("gate", "unscheduled", "check")}
        # the gate's counts sit beside the step times (None where no gate counted)
        out.update(self.gate.to_json() if self.gate else dict.fromkeys(self._GATE))
        if self.unscheduled is not None:
            out["unscheduled"] = [u.to_json() for u in self.unscheduled]
        if self.check is not None:
            out["check"] = self.check.to_json()
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ScheduleSummary":
        f = lambda k: _field(d, k, "schedule summary")  # noqa: E731
        unscheduled = d.get("unscheduled")
        return cls(
            int(f("steps")), float(f("throughput")), float(f("step_time_mean")),
            float(f("step_time_median")), float(f("step_time_p95")),
            float(f("step_time_cv")), float(f("straggler_pct")),
            float(f("straggler_pct_p95")), _optional(f("efficiency_median"), float),
            float(f("makespan_median")), _optional(d.get("efficiency_steps"), int),
            d.get("efficiency_note"),
            None if d.get("transfers") is None else GateCounts.from_json(d),
            None if unscheduled is None else tuple(UnscheduledTransfer.from_json(u)
                                                    for u in unscheduled),
            CheckSummary.from_json(d["check"]) if d.get("check") else None)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One schedule against TensorFlow's default in the same run (bench/metrics.py
    ``compare``)."""

    throughput_gain_pct: float
    cv_cut: float | None          # default's CV / this CV (None: undefined)
    straggler_cut: float | None   # default's straggler share / this one

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Comparison":
        f = lambda k: _field(d, k, "comparison")  # noqa: E731
        return cls(float(f("throughput_gain_pct")), _optional(f("cv_cut"), float),
                   _optional(f("straggler_cut"), float))


@dataclasses.dataclass(frozen=True)
class InRunCompute:
    """The calibration blocks of one rate's rounds (bench/client.py CALIBRATION): the
    gate with no order over the fast profiling link, and the compute reference."""

    fast_link_s: float
    compute_s: float
    fast_link_steps: tuple[float, ...]
    compute_steps: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fast_link_steps", _floats(self.fast_link_steps))
        object.__setattr__(self, "compute_steps", _floats(self.compute_steps))

    def to_json(self) -> dict[str, Any]:
        return {"fast_link_s": self.fast_link_s, "compute_s": self.compute_s,
                "fast_link_steps": list(self.fast_link_steps),
                "compute_steps": list(self.compute_steps)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "InRunCompute":
        f = lambda k: _field(d, k, "in-run compute")  # noqa: E731
        return cls(float(f("fast_link_s")), float(f("compute_s")), f("fast_link_steps"),
                   f("compute_steps"))


@dataclasses.dataclass(frozen=True)
class ProfiledCompute:
    """The profiling phase's compute, measured once before the rates."""

    comp_s: float          # slowest tower over the fast link: the link rates' comp
    compute_s: float       # the compute reference (no transfer): E's comp
    fast_link_s: float
    trace_op_sum_s: float  # the traced ops' sum

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ProfiledCompute":
        f = lambda k: float(_field(d, k, "profiled compute"))  # noqa: E731
        return cls(f("comp_s"), f("compute_s"), f("fast_link_s"), f("trace_op_sum_s"))


@dataclasses.dataclass(frozen=True)
class RateRun:
    """Every schedule at one link rate."""

    rate_bits: float
    comp_s: float                   # the compute the rate was chosen by (comm/comp)
    comm_s: float                   # the step's parameter bytes over the bottleneck link
    comm_comp_ratio: float
    bytes_per_ps: tuple[float, ...]  # parameter bytes each PS serves a worker per step
    schedules: Mapping[str, ScheduleSummary]   # in the order they were named
    vs_default: Mapping[str, Comparison]       # empty without TensorFlow's default
    step_times: Mapping[str, tuple[float, ...]]  # schedule -> its step times, in order
    schedule_lengths: Mapping[str, int]        # order -> transfers it lists
    # the simulator's step seconds per model and order (None: older results)
    predicted_step_s: Mapping[str, Mapping[str, float]] | None = None
    compute_s: float | None = None  # the compute reference, E's comp (None: older results)
    in_run: InRunCompute | None = None  # calibration blocks (None: not run)
    # Per PS, the gradient bytes one worker pushes into it per step, as traced (the
    # largest over the workers); None: inference, or older results.
    push_bytes_per_ps: tuple[float, ...] | None = None
    # The simulator's inputs: the client hands them over with the run, the CLI writes
    # them beside the result (<result>.sim.json.gz), not into it.
    sim_inputs: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False,
                                                            repr=False)
    # Each PS's gate totals at the end of the rate's rounds (records/gate.py
    # GateStats.totals: states, early hand-backs, "returned" and "rejoined" workers),
    # by PS index; None: the proxy backend, or older results.
    gate_totals: Mapping[str, Mapping[str, int]] | None = None
    # --emulate-gpu: the CPU the measured blocks cost (bench/cpu_guard.py CpuUse.to_json)
    # and the emulated compute measured in them (ms per step, the compute reference's
    # median); None: real compute
    cpu: Mapping[str, Any] | None = None
    emulated_compute_ms: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bytes_per_ps", _floats(self.bytes_per_ps))
        object.__setattr__(self, "step_times",
                           {n: _floats(t) for n, t in self.step_times.items()})

    @property
    def rate(self) -> str:
        """The rate as the report names it, e.g. ``500mbit``."""
        return f"{self.rate_bits / 1e6:.0f}mbit"

    def to_json(self) -> dict[str, Any]:
        out = {"rate_bits": self.rate_bits, "rate": self.rate, "comp_s": self.comp_s,
               "comm_s": self.comm_s, "comm_comp_ratio": self.comm_comp_ratio,
               "bytes_per_ps": list(self.bytes_per_ps),
               "schedules": {n: s.to_json() for n, s in self.schedules.items()},
               "vs_default": {n: c.to_json() for n, c in self.vs_default.items()},
               "step_times": {n: list(t) for n, t in self.step_times.items()},
               "schedule_lengths": dict(self.schedule_lengths),
               "predicted_step_s": self.predicted_step_s}
        if self.compute_s is not None:
            out["compute_s"] = self.compute_s
        out["in_run"] = self.in_run.to_json() if self.in_run else None
        if self.push_bytes_per_ps is not None:
            out["push_bytes_per_ps"] = list(self.push_bytes_per_ps)
        if self.gate_totals is not None:
            out["gate_totals"] = {ps: dict(t) for ps, t in self.gate_totals.items()}
        if self.cpu is not None:
            out["cpu"] = dict(self.cpu)
        if self.emulated_compute_ms is not None:
            out["emulated_compute_ms"] = self.emulated_compute_ms
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RateRun":
        f = lambda k: _field(d, k, "rate run")  # noqa: E731
        in_run = d.get("in_run")
        return cls(float(f("rate_bits")), float(f("comp_s")), float(f("comm_s")),
                   float(f("comm_comp_ratio")), f("bytes_per_ps"),
                   {n: ScheduleSummary.from_json(s) for n, s in f("schedules").items()},
                   {n: Comparison.from_json(c) for n, c in f("vs_default").items()},
                   f("step_times"), {n: int(k) for n, k in f("schedule_lengths").items()},
                   d.get("predicted_step_s"), _optional(d.get("compute_s"), float),
                   InRunCompute.from_json(in_run) if in_run else None,
                   _optional(d.get("push_bytes_per_ps"), _floats), d.get("sim_inputs"),
                   _optional(d.get("gate_totals"),
                             lambda g: {str(ps): {str(k): int(v) for k, v in t.items()}
                                        for ps, t in g.items()}),
                   d.get("cpu"), _optional(d.get("emulated_compute_ms"), float))


@dataclasses.dataclass(frozen=True)
class BenchConfigRecord:
    """The configuration a run was made with (bench/runner.py ``BenchConfig``, with the
    batch it resolved and its label). Settings added after the first results are None
    where a result does not record them."""

    label: str            # model/mode/W<workers>/P<ps>[/pinned]
    model: str
    mode: str
    workers: int
    ps: int
    batch: int            # per worker
    bandwidth: tuple[str, ...]
    schedules: tuple[str, ...]
    steps: int
    block_steps: int
    settle_steps: int
    warmup: int
    profile_steps: int
    skip_timeout: float
    window_bytes: int
    timeout_s: float
    loopback: bool
    backend: str | None = None
    pin_workers: bool | None = None
    check_rounds: int | None = None
    check_block_steps: int | None = None
    conserve_after_s: float | None = None
    calibrate: bool | None = None
    # --emulate-gpu (bench/replay.py): the emulated step's compute, the byte scale
    # (bytes and links both x it), the delay ops a step is cut into; None: real compute
    compute_ms: float | None = None
    byte_scale: float | None = None
    max_ops: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bandwidth", tuple(self.bandwidth))
        object.__setattr__(self, "schedules", tuple(self.schedules))

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["bandwidth"], out["schedules"] = list(self.bandwidth), list(self.schedules)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BenchConfigRecord":
        names = [f.name for f in dataclasses.fields(cls)]
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING]
        values = {k: _field(d, k, "bench config") for k in required}
        values.update({k: d[k] for k in names if k not in required and k in d})
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class MachineLoad:
    loadavg_1m: float
    loadavg_5m: float
    cpus: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MachineLoad":
        f = lambda k: _field(d, k, "machine load")  # noqa: E731
        return cls(float(f("loadavg_1m")), float(f("loadavg_5m")), int(f("cpus")))


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """One `tictac bench` run: every rate of one configuration. ``to_json`` /
    ``from_json`` are the result file's format; the code in between reads attributes."""

    config: BenchConfigRecord
    shaped: bool                    # a shaped network (False: the loopback fallback)
    machine_before: MachineLoad
    machine_after: MachineLoad
    wall_s: float
    param_bytes: int
    global_batch: int
    runs: tuple[RateRun, ...]       # one per rate, in the order measured
    network_reason: str = ""        # why the network is not shaped
    compute: ProfiledCompute | None = None  # None: older results
    incomplete: str = ""            # why some rates were not measured ("": all were)
    # The package's git commit ("": not a git checkout, or older results), whether its
    # checkout had uncommitted changes, and the command line that ran the benchmark.
    commit: str = ""
    dirty: bool = False
    command: str = ""
    # per host, its shaped queues' counters over the run (netns.ShapedNetwork.queue_stats;
    # None: unshaped, or older results)
    queues: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs", tuple(self.runs))

    @property
    def schedules(self) -> Mapping[str, ScheduleSummary]:
        """The first rate's per-schedule summaries."""
        return self.runs[0].schedules if self.runs else {}

    def to_json(self) -> dict[str, Any]:
        network: dict[str, Any] = {"shaped": self.shaped}
        if self.network_reason or not self.shaped:
            network["reason"] = self.network_reason
        if self.queues is not None:
            network["queues"] = self.queues
        out = {"config": self.config.to_json(), "network": network,
               "machine": {"before": self.machine_before.to_json(),
                           "after": self.machine_after.to_json()},
               "wall_s": self.wall_s, "commit": self.commit, "dirty": self.dirty,
               "command": self.command, "param_bytes": self.param_bytes,
               "global_batch": self.global_batch,
               "compute": self.compute.to_json() if self.compute else None,
               "runs": [r.to_json() for r in self.runs]}
        if self.incomplete:
            out["incomplete"] = self.incomplete
        if self.runs:  # the first rate's per-schedule metrics, at the top level too
            out["schedules"] = out["runs"][0]["schedules"]
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BenchRun":
        f = lambda k: _field(d, k, "bench run")  # noqa: E731
        network, machine = f("network"), f("machine")
        compute = d.get("compute")
        return cls(BenchConfigRecord.from_json(f("config")),
                   bool(_field(network, "shaped", "network")),
                   MachineLoad.from_json(_field(machine, "before", "machine")),
                   MachineLoad.from_json(_field(machine, "after", "machine")),
                   float(f("wall_s")), int(f("param_bytes")), int(f("global_batch")),
                   tuple(RateRun.from_json(r) for r in f("runs")),
                   str(network.get("reason") or ""),
                   ProfiledCompute.from_json(compute) if compute else None,
                   str(d.get("incomplete") or ""), str(d.get("commit") or ""),
                   bool(d.get("dirty", False)), str(d.get("command") or ""),
                   network.get("queues"))
