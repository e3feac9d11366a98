#!/usr/bin/env bash
# The test command: sets up .venv/ if needed, then runs the whole suite.
#   scripts/test.sh            everything (what CI runs; 22-25 minutes on 2 cores)
#   scripts/test.sh --fast     the unit tests: no cluster, no root, nothing marked slow
# Other arguments go to pytest (e.g. scripts/test.sh -k tac, scripts/test.sh tests/run).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup_env.sh"
cd "$root"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
if [ "${1:-}" = "--fast" ]; then
  shift
  exec .venv/bin/python -m pytest -q -rs -m "not slow and not cluster and not root" "$@"
fi
exec .venv/bin/python -m pytest -q -rs "$@"
