"""What a process of a benchmark's cluster has used so far, read from ``/proc`` (Linux):
CPU seconds and resident memory. The benchmarks in ``benchmarks/`` read the PS's."""

from __future__ import annotations

import os


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (every thread) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (NaN where ``/proc`` does not say)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")
