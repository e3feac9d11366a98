#!/usr/bin/env bash
# Creates .venv/ at the repository root with TensorFlow (CPU), tf_keras, Keras 3 and
# this package (editable, with the test extra), then prebuilds the native TicTac gate
# against that TensorFlow (`tictac build`; cached per user, so tests and the main job
# don't pay for it). Idempotent: each part re-runs only when its inputs change. Used by
# scripts/main.sh and scripts/test.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
PY="${PYTHON:-python3}"
stamp_inputs="$(cat setup.cfg pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)"
stamp=".venv/.tictac-setup-$stamp_inputs"
native_inputs="$(cat tictac_hooks/enforce/native/*.cc tictac_hooks/enforce/native/*.h \
  tictac_hooks/enforce/native/build.py | sha256sum | cut -c1-16)"
native_stamp=".venv/.tictac-native-$native_inputs"
prebuild() {
  [ -f "$native_stamp" ] && return 0
  # (TensorFlow's start-up banner, printed before its log level applies, left out)
  .venv/bin/python -m tictac_hooks.cli build >/dev/null 2> >(grep -Ev \
    'oneDNN custom operations|absl::InitializeLog|cpu_feature_guard|appropriate compiler flags|the following instructions' >&2)
  rm -f .venv/.tictac-native-*
  touch "$native_stamp"
}
if [ -x .venv/bin/python ] && [ -f "$stamp" ]; then
  prebuild
  exit 0
fi
echo "[setup] creating .venv (TensorFlow CPU, tf_keras, Keras 3, tictac-hooks)" >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# tensorflow-cpu rather than tensorflow: half the download, enough for CPU machines.
# The extras by hand (the package goes in with --no-deps below): [test] pytest,
# hypothesis, jsonschema, pyyaml and wheel (tests/test_wheel.py builds the package's
# wheel), [bench] matplotlib (the benchmark report's plots; the tests check them).
.venv/bin/python -m pip install -q "tensorflow-cpu==2.21.*" "keras>=3.10" "grpcio>=1.60" \
  numpy absl-py protobuf tensorboard hpack pytest hypothesis jsonschema pyyaml matplotlib \
  wheel
# tf_keras declares a dependency on the full `tensorflow` wheel; tensorflow-cpu provides
# the same module, so install it without its dependencies.
.venv/bin/python -m pip install -q --no-deps "tf_keras==2.21.*"
# setup.cfg maps tictac_hooks.patches to patches/, so setuptools installs the editable
# package with an import finder (its lenient mode; "compat" mode could not map patches/,
# and "strict" mode prints a box of its own), and says so in an "Editable installation"
# warning box: folders named like the package in the working directory may be imported
# first. Here that folder is the package's own source, so the note is filtered out.
PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
  .venv/bin/python -m pip install -q --no-deps -e .
rm -f .venv/.tictac-setup-*
touch "$stamp"
prebuild
echo "[setup] done" >&2
