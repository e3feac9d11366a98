#!/usr/bin/env bash
# The main job: sets up .venv/ if needed, then runs it. Extra arguments are passed on.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup_env.sh"
cd "$root"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec .venv/bin/tictac analyze --model ResNet50 --training "$@"
