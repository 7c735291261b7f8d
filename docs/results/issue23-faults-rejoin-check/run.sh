#!/bin/bash
cd /tmp/fcmp
for i in 1 2; do for c in fb669d6 27c2449; do
PYTHONPATH=/tmp/bench-$c /work/main/.venv/bin/python -m p2pinfer bench faults --seed $i --json > $c-$i.json 2>$c-$i.err
echo "$c $i rc=$? load=$(cut -d' ' -f1 /proc/loadavg)" >> log
done; done; echo done >> log
