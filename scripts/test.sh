#!/usr/bin/env bash
# The test command: sets up .venv/ if needed, then runs the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k tac).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup_env.sh"
cd "$root"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec .venv/bin/python -m pytest -q -rs "$@"
