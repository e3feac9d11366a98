"""The CPU guard of --emulate-gpu (bench/cpu_guard.py): a run is CPU-bound where a core
was over 85 % busy or a worker used over a third of a core, and says which; the meter
reads real /proc counters of a real process group."""

import os
import subprocess
import sys
import time

from tictac_hooks.bench.cpu_guard import CpuMeter, CpuUse, core_ticks


def test_the_guard_names_what_tripped_it():
    calm = CpuUse(10.0, (0.40, 0.52), {"worker0": 2.0, "worker1": 3.0, "ps0": 4.0})
    assert calm.reasons([0, 1]) == []
    assert calm.worker_shares([0, 1]) == [0.2, 0.3]
    busy_core = CpuUse(10.0, (0.90, 0.20), {"worker0": 1.0})
    assert busy_core.reasons([0]) == ["a core was 90% busy (guard 85%)"]
    busy_worker = CpuUse(10.0, (0.5, 0.5), {"worker0": 1.0, "worker1": 3.5})
    (why,) = busy_worker.reasons([0, 1])
    assert "a worker used 35% of a core" in why
    assert CpuUse.from_json(busy_worker.to_json()) == busy_worker


def test_the_meter_counts_a_busy_process_group_and_the_cores():
    assert len(core_ticks()) == os.cpu_count()
    spin = subprocess.Popen([sys.executable, "-c",
                             "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"],
                            start_new_session=True)
    try:
        time.sleep(0.2)
        meter = CpuMeter({"worker0": os.getpgid(spin.pid)}).start()
        time.sleep(0.8)
        use = meter.stop()
    finally:
        spin.kill()
        spin.wait()
    assert 0.75 <= use.wall_s < 1.5
    assert use.share("worker0") > 0.4, use  # a spinning process: most of a core
    assert max(use.core_busy) > 0.4, use
    assert len(use.core_busy) == os.cpu_count()
