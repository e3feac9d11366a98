"""The lab: research probes the benchmark scripts use, not shipped in the wheel.

- ``timeline``: a worker's step read from its FULL_TRACE step_stats
  (benchmarks/probe_step_timeline.py);
- ``linkmeter``: what a shaped link really carries (goodput, round trips, bytes through
  its token bucket; benchmarks/probe_link_goodput.py, bench_shaped_overhead.py and the
  shaped-network tests);
- ``procstat``: a process's CPU seconds and memory, from /proc.

Import as ``benchmarks.lab.<module>`` with the repository's root on ``sys.path`` (the
scripts put it there; pytest runs from it).
"""
