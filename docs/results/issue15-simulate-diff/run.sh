#!/bin/bash
# usage: run.sh SRC_ROOT OUT_DIR   (before/: accd742, after/: 86f73e3, step-<commit>/: that commit)
# Eleven fixed-seed `p2pinfer simulate --json` runs of the checkout SRC_ROOT, each
# written to OUT_DIR/<name>.json with its command and commit (wrap.py).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$1; OUT=$2; mkdir -p "$OUT"
PY=${PY:-python3}
run() { name=$1; shift; $PY "$HERE/wrap.py" "$SRC" "$@" > "$OUT/$name.json"; }
run all8        --policy all --nodes 8 --requests 1200 --seed 3
run directory16 --discovery directory --nodes 16 --requests 1500 --seed 5
run shared4     --shared-cores 2 --nodes 4 --requests 600 --concurrency 4 --seed 7
run churn8      --churn-interval 8 --nodes 8 --requests 1500 --seed 11
run hotbusy     --popularity hot:0.6 --nodes 8 --rate 8 --busy-queue-ms 1500 --requests 1500 --seed 13
run paperloss   --policy paper --latency-ms lognormal:20:0.5 --loss 0.05 --nodes 6 --requests 1200 --seed 17
run conv        --workload conversations --nodes 6 --requests 1200 --seed 19
run dirchurn    --discovery directory --churn-interval 6 --nodes 12 --requests 1500 --seed 23
run hotbusychurn --popularity hot:0.6 --nodes 8 --rate 8 --busy-queue-ms 1500 --churn-interval 5 --requests 1500 --seed 29
run oraclechurn --policy oracle --churn-interval 8 --nodes 8 --requests 1000 --seed 31
run sharedhot   --shared-cores 2 --nodes 6 --popularity zipf:1.2 --rate 3 --requests 1000 --seed 37
