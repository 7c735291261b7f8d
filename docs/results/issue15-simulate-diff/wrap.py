"""Run one `p2pinfer simulate --json` of the checkout SRC and print it with its provenance.

usage: wrap.py SRC ARGS...   (ARGS go to `p2pinfer simulate --json`)

The simulator's JSON has no provenance of its own at the commits compared
here, so this wraps it: {"provenance": {command, commit, ...}, "output": <its JSON>}.
Standalone on purpose: it must not import the p2pinfer of either checkout.
"""
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

src, args = os.path.abspath(sys.argv[1]), sys.argv[2:]
cmd = ["simulate", "--json", *args]
head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True, check=True).stdout.strip()
dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=src, capture_output=True, text=True).stdout.strip()
t0 = time.monotonic()
out = subprocess.run([sys.executable, "-m", "p2pinfer", *cmd], env=dict(os.environ, PYTHONPATH=src),
                     cwd="/tmp", capture_output=True, text=True, check=True).stdout
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.lower().startswith("model name")), platform.machine())
json.dump({
    "provenance": {
        "command": "p2pinfer " + shlex.join(cmd),
        "commit": head + ("-dirty" if dirty else ""),
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu, "logical_cores": os.cpu_count(), "python": platform.python_version()},
        "process_wall_s": round(time.monotonic() - t0, 1),
    },
    "output": json.loads(out),
}, sys.stdout, indent=1)
print()
