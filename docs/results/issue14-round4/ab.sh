#!/bin/bash
# issue 14 round 4: main (9dda19f) against issue-14e, 16 nodes interleaved, then 32 nodes on the branch
cd /tmp/idle14
PY=/work/main/.venv/bin/python
for i in 1 2; do
  for side in main branch; do
    src=/work/wtsim; [ $side = branch ] && src=/work/wt14e
    echo "$(date -u +%T) $side run $i" >> ab.log
    PYTHONPATH=$src $PY -m p2pinfer bench idle --nodes 16 --settle 30 --measure 90 --out /tmp/idle14/$side-16-run$i.json > /dev/null 2>> ab.err
  done
done
echo "$(date -u +%T) branch 32" >> ab.log
PYTHONPATH=/work/wt14e $PY -m p2pinfer bench idle --nodes 32 --settle 30 --measure 90 --profile /tmp/idle14/prof-branch-32 --out /tmp/idle14/branch-32.json > /dev/null 2>> ab.err
echo "$(date -u +%T) done" >> ab.log
