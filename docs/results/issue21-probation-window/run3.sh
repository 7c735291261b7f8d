#!/bin/bash
set -u
out=/work/notes/b21
for side in before after; do
  if [ $side = before ]; then tree=/tmp/wt21-before; else tree=/tmp/wt21-after; fi
  echo "$(date -u +%T) run 3 $side" >> $out/log
  (cd $tree && PYTHONPATH=$tree timeout 900 flock /work/notes/bench.lock /work/main/.venv/bin/python -m p2pinfer.cli.main bench conversations --conversations 2 --turns 4 --max-tokens 200 --json > $out/conv-$side-run3.json 2> $out/conv-$side-run3.err)
  echo "$(date -u +%T) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/log
done
