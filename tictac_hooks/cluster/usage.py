"""What a local cluster's task costs the machine: CPU seconds and memory of its process
group, read from /proc (Linux). The task's whole group counts: a task started through a
wrapper (``ip netns exec``) is the wrapper's children too."""

from __future__ import annotations

import dataclasses
import os

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclasses.dataclass(frozen=True)
class Usage:
    """CPU seconds used so far (user + system), resident and peak resident bytes."""

    cpu_s: float
    rss_bytes: int
    peak_rss_bytes: int


def group_usage(pgid: int) -> Usage | None:
    """The summed usage of every process in process group ``pgid`` (None: no /proc, or
    no such group)."""
    cpu = rss = peak = 0
    found = False
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # field 5, pgrp (after the name)
                continue
            cpu += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("VmHWM:"):
                        peak += int(line.split()[1]) * 1024
            found = True
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return Usage(cpu / _TICKS, rss, peak) if found else None
