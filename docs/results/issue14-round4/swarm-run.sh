#!/bin/bash
# issue 14 round 4: bench swarm under MMLU, main before it (9dda19f) against main after it, interleaved
cd /tmp/sw14
PY=/work/main/.venv/bin/python
for i in 1 2; do
  for side in before after; do
    src=/work/wtsim; [ $side = after ] && src=/tmp/wt-head
    echo "$(date -u +%T) $side run $i load $(cut -d' ' -f1-3 /proc/loadavg)" >> log
    PYTHONPATH=$src $PY -m p2pinfer bench swarm --policies cost --requests 200 --delay-ms 1 --no-simulate --json > $side-run$i.json 2> $side-run$i.err
    echo "$(date -u +%T) end rc=$?" >> log
  done
done
