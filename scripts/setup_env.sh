#!/usr/bin/env bash
# Creates .venv/ at the repository root with TensorFlow (CPU), tf_keras, Keras 3 and
# this package (editable, with the test extra). Idempotent: re-runs only when the
# inputs below change. Used by scripts/main.sh and scripts/test.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
PY="${PYTHON:-python3}"
stamp_inputs="$(cat setup.cfg pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)"
stamp=".venv/.tictac-setup-$stamp_inputs"
if [ -x .venv/bin/python ] && [ -f "$stamp" ]; then
  exit 0
fi
echo "[setup] creating .venv (TensorFlow CPU, tf_keras, Keras 3, tictac-hooks)" >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# tensorflow-cpu rather than tensorflow: half the download, enough for CPU machines.
.venv/bin/python -m pip install -q "tensorflow-cpu==2.21.*" "keras>=3.10" "grpcio>=1.60" \
  numpy absl-py protobuf tensorboard hpack pytest matplotlib
# tf_keras declares a dependency on the full `tensorflow` wheel; tensorflow-cpu provides
# the same module, so install it without its dependencies.
.venv/bin/python -m pip install -q --no-deps "tf_keras==2.21.*"
.venv/bin/python -m pip install -q --no-deps -e .
rm -f .venv/.tictac-setup-*
touch "$stamp"
echo "[setup] done" >&2
