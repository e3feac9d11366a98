#!/usr/bin/env bash
# The main job: sets up .venv/ if needed, then trains on a local PS cluster with TicTac
# (examples/keras_ps_train.py). Extra arguments are passed on, e.g. --steps 200.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup_env.sh"
cd "$root"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec .venv/bin/python examples/keras_ps_train.py "$@"
