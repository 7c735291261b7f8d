#!/bin/bash
# issue 21 probation window: bench conversations, before (2674301, whole-answer hold) vs after (22b7d7b), interleaved.
set -u
out=/work/notes/b21
for i in 1 2 3; do
  for side in before after; do
    if [ $side = before ]; then tree=/tmp/wt21-before; else tree=/tmp/wt21-after; fi
    echo "$(date -u +%T) run $i $side" >> $out/log
    (cd $tree && PYTHONPATH=$tree timeout 900 flock /work/notes/bench.lock /work/main/.venv/bin/python -m p2pinfer.cli.main bench conversations --conversations 2 --turns 4 --max-tokens 200 --json > $out/conv-$side-run$i.json 2> $out/conv-$side-run$i.err)
    echo "$(date -u +%T) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/log
  done
done
