"""The records TicTac keeps, defined once, with one meaning per field written beside
it; every name is importable from here (``from tictac_hooks.records import GateStep``).

- records/gate.py: what a gate saw. :class:`GateStep`, one (step, worker) at one PS,
  with a :class:`TransferRecord` per RecvTensor and a :class:`SkipRecord` per skip;
  :class:`GateStats`, what ``stats`` answers; the transfer states and skip reasons.
  ``to_json`` / ``from_json`` are the wire format on every backend, and gate_records.cc
  writes the same fields (tests/test_records.py fails when they drift).
- records/steps.py: what TicTac made of them. :class:`WorkerStep`, one step of one
  worker merged over the PSes (run/steplog.py); :class:`CheckResult`, an order
  check's result (run/order_check.py).
- records/bench.py: what the benchmark measured. :class:`ClientStep`, one synchronous
  step; :class:`BenchRun`, one run's result as ``tictac bench --json`` writes it.

Serialization happens only at the wire and on disk; between modules records travel as
these objects. ``from_json`` refuses a record that lacks a field (:class:`RecordError`,
naming it). Standard library only.
"""

from __future__ import annotations

from tictac_hooks.records._base import (  # noqa: F401
    RecordError)
from tictac_hooks.records.gate import (  # noqa: F401
    ABSENT,
    CANCELLED,
    DUPLICATE,
    EARLY_REASONS,
    EVICTED,
    GateStats,
    GateStep,
    LATE,
    LISTED,
    PASS,
    SHUTDOWN,
    SUPERSEDED,
    SKIP_REASONS,
    SLOW,
    STALE,
    STATES,
    SkipRecord,
    TIMEOUT,
    TransferRecord,
    UNEXPECTED,
    bytes_per_transfer,
    served_sizes)
from tictac_hooks.records.steps import (  # noqa: F401
    CHECK,
    CheckBlock,
    CheckResult,
    PHASE_NAMES,
    PROFILING,
    RatioSpread,
    SCHEDULED,
    WorkerCheck,
    WorkerStep)
from tictac_hooks.records.bench import (  # noqa: F401
    BenchConfigRecord,
    BenchRun,
    CheckSummary,
    ClientStep,
    Comparison,
    GateCounts,
    InRunCompute,
    MachineLoad,
    ProfiledCompute,
    RateRun,
    ScheduleSummary,
    UnscheduledTransfer)
