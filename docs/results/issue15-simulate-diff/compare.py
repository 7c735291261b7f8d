import json, sys, pathlib
WALL = ("decision_us_p50", "decision_us_p99", "directory_query_us_p50", "wall_s")
def strip(r):
    r = json.loads(json.dumps(r))
    for k in WALL:
        r.pop(k, None); r.get("sim", {}).pop(k, None)
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
A, B = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
ignore = set(sys.argv[3:])
for f in sorted(A.glob("*.json")):
    a = json.loads(f.read_text()); b = json.loads((B / f.name).read_text())
    if not isinstance(a, list): a, b = [a], [b]
    lines = []
    for x, y in zip(a, b):
        lines += [l for l in diff(strip(x), strip(y), x["policy"]) if not any(l.startswith(f"{x['policy']}{i}") for i in ignore)]
    print(f"{f.stem}: {'identical' if not lines else str(len(lines)) + ' differences'}")
    for l in lines[:12]: print("   ", l)
