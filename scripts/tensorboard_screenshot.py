#!/usr/bin/env python3
"""Opens TicTac's TensorBoard logs in headless Chromium, as a person would, and saves a PNG.

Starts TensorBoard on LOG_DIR (loopback, a free port), waits until it serves the
``tictac/*`` scalars, opens the Scalars dashboard filtered to the step-time and phase
charts with smoothing off (``?forceSVG=true``: headless Chromium has no WebGL), and
writes the screenshot. Each worker's step-time chart draws TensorFlow's order and
TicTac's as two colours (run/tensorboard.py), so the switch and the order check's
blocks are where the colour changes.

    .venv/bin/python scripts/tensorboard_screenshot.py runs/keras_ps_train docs/tensorboard.png

Needs Debian's ``chromium`` (apt-get install chromium) and the tensorboard package.
Exits 2 with the reason when either is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
TAG_FILTER = "tictac/(block_step_time|step_time|phase)"


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # loopback only
        return r.read()


def wait_for_scalars(base: str, timeout_s: float = 60.0) -> dict:
    """TensorBoard's scalar tags per run, once it has loaded some ``tictac/`` ones."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            tags = json.loads(_get(f"{base}/data/plugin/scalars/tags"))
            if any(t.startswith("tictac/") for run in tags.values() for t in run):
                return tags
            last = "no tictac/ scalars yet"
        except OSError as e:
            last = str(e)
        time.sleep(0.5)
    raise TimeoutError(f"TensorBoard at {base} served no tictac/ scalars within "
                       f"{timeout_s:.0f} s ({last})")


def screenshot(log_dir: str, out_png: str, width: int = 1400, height: int = 1100,
               timeout_s: float = 90.0) -> dict:
    """Writes ``out_png``; returns the tags per run TensorBoard served."""
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError("no Chromium: apt-get install chromium")
    if not os.path.isdir(log_dir):
        raise FileNotFoundError(f"no log directory {log_dir!r}: run the main job first "
                                "(scripts/main.sh writes runs/keras_ps_train)")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    profile = tempfile.mkdtemp(prefix="tictac-chromium-")
    # TensorBoard keeps a .tensorboard-info folder in TMPDIR: give it ours, removed below.
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", log_dir,
                           "--host", "127.0.0.1", "--port", str(port), "--reload_interval",
                           "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          env=dict(os.environ, TMPDIR=profile))
    try:
        tags = wait_for_scalars(base, timeout_s)
        url = (f"{base}/?forceSVG=true#scalars&_smoothingWeight=0"
               f"&tagFilter={urllib.request.quote(TAG_FILTER, safe='')}")
        out = os.path.abspath(out_png)
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        if os.path.exists(out):
            os.remove(out)
        proc = subprocess.run(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "--virtual-time-budget=20000",
             f"--screenshot={out}", url],
            capture_output=True, text=True, timeout=timeout_s)
        if not os.path.exists(out):
            raise RuntimeError(f"Chromium wrote no screenshot (exit {proc.returncode}):\n"
                               f"{proc.stderr[-2000:]}")
        return tags
    finally:
        tb.terminate()
        try:
            tb.wait(10)
        except subprocess.TimeoutExpired:
            tb.kill()
            tb.wait()
        shutil.rmtree(profile, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log_dir", nargs="?", default=os.path.join("runs", "keras_ps_train"))
    p.add_argument("out_png", nargs="?", default=os.path.join("docs", "tensorboard.png"))
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=1100)
    args = p.parse_args(argv)
    try:
        tags = screenshot(args.log_dir, args.out_png, args.width, args.height)
    except (FileNotFoundError, TimeoutError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    runs = ", ".join(sorted(tags))
    print(f"wrote {args.out_png} (TensorBoard runs: {runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
