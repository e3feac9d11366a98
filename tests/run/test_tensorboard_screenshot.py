"""TensorBoard as a person sees it: TicTac's scalars, written by StepTimeWriter, served
by TensorBoard and drawn by headless Chromium into a PNG (scripts/tensorboard_screenshot.py).
Skips, with the reason, where Chromium is not installed."""

import json
import os
import struct
import sys
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import tensorboard_screenshot as shot  # noqa: E402

from tictac_hooks.run.tensorboard import StepTimeWriter  # noqa: E402
from tictac_hooks.records import (CHECK, PROFILING, SCHEDULED, CheckBlock,  # noqa: E402
                                  CheckResult, RatioSpread, WorkerStep)

W = "/job:worker/replica:0/task:{}/device:CPU:0"


def write_logs(log_dir):
    writer = StepTimeWriter(str(log_dir))
    writer.switched("tic", 14, 1)
    records, blocks = [], {}
    for w in (0, 1):
        t = 1000.0
        for i in range(60):
            phase = PROFILING if i < 10 else (SCHEDULED if (i - 10) // 10 % 2 == 0 else CHECK)
            step_time = 0.40 if phase == SCHEDULED else 0.46
            records.append(WorkerStep(W.format(w), i, t, step_time, 0.1, phase))
            t += step_time
        blocks[W.format(w)] = (CheckBlock(SCHEDULED, 0.40, tuple(range(10, 20))),
                               CheckBlock(CHECK, 0.46, tuple(range(20, 30))))
    writer.write(records)
    writer.choice(CheckResult(
        algorithm="tic", rounds=1, block_steps=10, candidates={}, rule="", workers={},
        spread=RatioSpread(2, 1.15, 1.1, 1.2), blocks=blocks, decision="tictac",
        chosen="tic"))
    writer.close()


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.slow
def test_the_step_time_charts_render_in_headless_chromium(tmp_path):
    if shot.find_chromium() is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    write_logs(tmp_path / "logs")
    out = tmp_path / "tb.png"
    tags = shot.screenshot(str(tmp_path / "logs"), str(out), width=1200, height=900)
    # TensorBoard served both orders' step-time series for both workers ...
    for run in ("tensorflow_order", "tictac_order"):
        assert {"tictac/step_time/worker_0", "tictac/step_time/worker_1",
                "tictac/block_step_time/worker_0"} <= set(tags[run]), tags
    assert "tictac/phase" in tags["worker_0"] and "tictac/choice" in tags["worker_0"]
    # ... and Chromium drew a page of the asked size that is not blank.
    assert png_size(out) == (1200, 900)
    assert os.path.getsize(out) > 30_000


@pytest.mark.slow
def test_descriptions_and_units_reach_tensorboard(tmp_path):
    if shot.find_chromium() is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    write_logs(tmp_path / "logs")
    import subprocess
    port = shot._free_port()
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir",
                           str(tmp_path / "logs"), "--host", "127.0.0.1", "--port", str(port)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          env=dict(os.environ, TMPDIR=str(tmp_path)))
    try:
        base = f"http://127.0.0.1:{port}"
        tags = shot.wait_for_scalars(base)
        meta = tags["tictac_order"]["tictac/step_time/worker_0"]
        assert "[s]" in meta["displayName"] and "Seconds per step" in meta["description"]
        with urllib.request.urlopen(f"{base}/data/plugin/scalars/tags", timeout=5) as r:
            assert json.loads(r.read())
    finally:
        tb.terminate()
        tb.wait(10)
