#!/bin/bash
# bench concurrency at 1 in flight, before (main df542fd) and after (issue-18-stream-end) alternating, each run under the benchmark lock.
for run in 1 2; do
  for side in before after; do
    cd /tmp/sp18/$side || exit 1
    PYTHONPATH=/tmp/sp18/$side flock /work/notes/bench.lock /work/main/.venv/bin/python -m p2pinfer bench concurrency --levels 1 --rounds 5 \
      --llama-server /work/build/llama-cpp-build/bin/llama-server --json > /tmp/sp18/conc-$side-$run.json 2> /tmp/sp18/conc-$side-$run.err
    echo "$side $run rc=$? $(date -u +%H:%M:%S)" >> /tmp/sp18/conc.log
  done
done
