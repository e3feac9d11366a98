"""The CPU guard of `tictac bench --emulate-gpu`: is a run measuring the network and the
order, or this machine's cores?

Emulated workers compute without a core, but their gRPC, serialisation and executor
still run on the machine's few cores. A run is **CPU-bound**, and left out of any gain
table, where over its measured blocks

- any core was busy more than ``CORE_BUSY_MAX`` (85 %) of the time, or
- a worker's process used more than ``WORKER_SHARE_MAX`` (a third) of a core: a third
  of its step's wall time goes to CPU work that a worker with a core of its own (and a
  GPU) would overlap, here it queues for a shared one.

:class:`CpuMeter` reads /proc/stat (per core) and every task's process group
(cluster/usage.py) at the start and end of a window.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

from tictac_hooks.cluster.usage import group_usage

CORE_BUSY_MAX = 0.85
WORKER_SHARE_MAX = 1 / 3


def core_ticks() -> list[tuple[int, int]]:
    """(busy, total) jiffies of each core so far, from /proc/stat."""
    out = []
    with open("/proc/stat") as f:
        for line in f:
            name, *values = line.split()
            if not (name.startswith("cpu") and name != "cpu"):
                continue
            v = [int(x) for x in values]
            idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
            total = sum(v[:8])  # (guest time is counted in user already)
            out.append((total - idle, total))
    return out


@dataclasses.dataclass(frozen=True)
class CpuUse:
    """What a window cost: each core's busy share, each task's CPU seconds."""

    wall_s: float
    core_busy: tuple[float, ...]
    task_cpu_s: Mapping[str, float]   # "worker0", "ps0", ... -> CPU seconds

    def share(self, task: str) -> float:
        """The task's CPU as a share of one core over the window."""
        return self.task_cpu_s.get(task, 0.0) / self.wall_s if self.wall_s > 0 else 0.0

    def worker_shares(self, workers: list[int]) -> list[float]:
        return [self.share(f"worker{w}") for w in workers]

    def reasons(self, workers: list[int]) -> list[str]:
        """Why the window is CPU-bound (empty: it is not)."""
        out = []
        busy = max(self.core_busy, default=0.0)
        if busy > CORE_BUSY_MAX:
            out.append(f"a core was {busy:.0%} busy (guard {CORE_BUSY_MAX:.0%})")
        shares = self.worker_shares(workers)
        if shares and max(shares) > WORKER_SHARE_MAX:
            out.append(f"a worker used {max(shares):.0%} of a core (guard "
                       f"{WORKER_SHARE_MAX:.0%} of its step's wall time)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s, "core_busy": list(self.core_busy),
                "task_cpu_s": dict(self.task_cpu_s)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CpuUse":
        return cls(float(d["wall_s"]), tuple(float(x) for x in d["core_busy"]),
                   {str(k): float(v) for k, v in d["task_cpu_s"].items()})


def emulated_lines(measured_ms: float, requested_ms: float, workers: list[int],
                   cpu: CpuUse) -> list[str]:
    """What every --emulate-gpu run prints (issue 53): the emulated compute measured
    against the requested with the workers' mean CPU share, and where the guard
    tripped, the CPU-bound line with its reasons."""
    shares = cpu.worker_shares(workers)
    share = 100 * sum(shares) / len(shares) if shares else float("nan")
    lines = [f"emulated compute: {measured_ms:.1f} ms of {requested_ms:g} ms requested "
             f"({len(workers)} workers, CPU {share:.0f} % of a core per worker)"]
    why = cpu.reasons(workers)
    if why:
        lines.append(f"CPU-bound: {'; '.join(why)}: these figures measure this machine's "
                     "cores, not the network; leave them out of a gain table")
    return lines


class CpuMeter:
    """Measures a window: ``start()``, the work, ``stop()`` -> :class:`CpuUse`.
    ``groups`` maps a task's name to its process group id."""

    def __init__(self, groups: Mapping[str, int]) -> None:
        self.groups = dict(groups)
        self._t0 = 0.0
        self._cores: list[tuple[int, int]] = []
        self._cpu: dict[str, float] = {}

    def _task_cpu(self) -> dict[str, float]:
        out = {}
        for name, pgid in self.groups.items():
            usage = group_usage(pgid)
            if usage is not None:
                out[name] = usage.cpu_s
        return out

    def start(self) -> "CpuMeter":
        self._t0 = time.monotonic()
        self._cores = core_ticks()
        self._cpu = self._task_cpu()
        return self

    def stop(self) -> CpuUse:
        wall = time.monotonic() - self._t0
        cores = core_ticks()
        busy = tuple((b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
                     for (b0, t0), (b1, t1) in zip(self._cores, cores))
        now = self._task_cpu()
        return CpuUse(wall, busy, {k: now[k] - self._cpu[k] for k in now if k in self._cpu})
