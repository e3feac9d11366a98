#!/usr/bin/env bash
# The main job: sets up .venv/ if needed, then trains on a local PS cluster with TicTac
# (examples/keras_ps_train.py): on a shaped 2 Gbit/s link in network namespaces where
# root and tc are available, else on loopback (it says why). Prints, per worker, the
# step time in TensorFlow's order and in TicTac's, measured in the same run. Extra
# arguments are passed on, e.g. --steps 300 or --rate 1gbit.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup_env.sh"
cd "$root"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# TensorFlow 2.21 prints its start-up banner (oneDNN, CPU features) before its log level
# applies, once per process: leave those lines out, keep everything else on stderr.
banner='oneDNN custom operations are on|All log messages before absl::InitializeLog|cpu_feature_guard|rebuild TensorFlow with the appropriate compiler flags|To enable the following instructions'
status=0
.venv/bin/python examples/keras_ps_train.py --steps 700 \
  --tictac_check_block_steps=10 "$@" \
  2> >(grep -Ev "$banner" >&2) || status=$?
wait
exit "$status"
