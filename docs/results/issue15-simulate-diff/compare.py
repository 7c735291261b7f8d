"""Compare fixed-seed `p2pinfer simulate --json` runs field by field, wall-clock fields left out.

usage: compare.py DIR_1 DIR_2 [DIR_3 ...]

Each DIR holds one JSON per run (written by run.sh through wrap.py:
{"provenance": {...}, "output": <simulate's JSON>}). Each directory is
compared with the next one; every difference is printed, none left out.
"""
import json
import pathlib
import sys

WALL = ("decision_us_p50", "decision_us_p99", "directory_query_us_p50", "wall_s")


def strip(r):
    r = json.loads(json.dumps(r))
    for k in WALL:
        r.pop(k, None)
        r.get("sim", {}).pop(k, None)
    return r


def diff(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                yield f"{path}.{k}: {'missing before' if k not in a else 'missing after'}"
            else:
                yield from diff(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from diff(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path}: {a} -> {b}"


def load(path):
    doc = json.loads(path.read_text())
    out = doc["output"]
    return doc["provenance"], out if isinstance(out, list) else [out]


def compare(A, B):
    for f in sorted(A.glob("*.json")):
        _, a = load(f)
        _, b = load(B / f.name)
        lines = []
        for x, y in zip(a, b):
            lines += diff(strip(x), strip(y), x["policy"])
        print(f"{f.stem}: {'identical' if not lines else str(len(lines)) + ' differences'}")
        for line in lines:
            print("   ", line)


dirs = [pathlib.Path(d) for d in sys.argv[1:]]
for A, B in zip(dirs, dirs[1:]):
    first = sorted(A.glob("*.json"))[0].name
    commit_a, commit_b = (load(d / first)[0]["commit"][:7] for d in (A, B))
    print(f"## {A.name} ({commit_a}) -> {B.name} ({commit_b})")
    compare(A, B)
    print()
