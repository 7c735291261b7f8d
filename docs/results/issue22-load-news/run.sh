#!/bin/sh
# Before/after of issue 22's news-driven load reports, cost policy, 8 seeds per cell.
# Usage: run.sh BEFORE_CHECKOUT AFTER_CHECKOUT (each with p2pinfer/lab/cost_vs_paper.py present).
set -e
here=$(cd "$(dirname "$0")" && pwd)
PYTHONPATH="$1" python "$here/ab.py" /tmp/ab-before.json
PYTHONPATH="$2" python "$here/ab.py" /tmp/ab-after.json
