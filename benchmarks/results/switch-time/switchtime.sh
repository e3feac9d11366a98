#!/bin/bash
# usage: switchtime.sh TREE LABEL ; runs main-job model (mlp) and tutorial model, 3x each, loopback
TREE=$1; LABEL=$2
for i in 1 2 3; do
  for ex in keras_ps_train ps_workloads_train; do
    out=/tmp/sw/$LABEL-$ex-$i; rm -rf $out; mkdir -p $out
    extra=""
    if [ $ex = keras_ps_train ]; then extra="--steps=120 --steps_per_epoch=40"; else extra="--steps=200 --steps_per_epoch=50"; fi
    PYTHONPATH=$TREE TF_CPP_MIN_LOG_LEVEL=2 timeout 400 /work/main/.venv/bin/python $TREE/examples/$ex.py --network=loopback $extra --tictac_check_rounds=1 --log_dir=$out --summary_json=$out/s.json > $out/log 2>&1
    /work/main/.venv/bin/python - "$out/s.json" "$LABEL" "$ex" <<'PY'
import json,sys
try:
    s=json.load(open(sys.argv[1])); h=s.get("hook",{})
    print(sys.argv[2], sys.argv[3], "switch_ms", round(h.get("switch_in_background_ms",-1)), "installed_at", h.get("installed_at_step"), "sched", s.get("order",{}).get("scheduled_steps"), "followed", s.get("order",{}).get("followed"), "not_ordered", s.get("not_ordered","")[:60])
except Exception as e: print(sys.argv[2], sys.argv[3], "ERR", e)
PY
  done
done
