"""``p2pinfer lab reproduce``: re-run the published experiments and say which figures moved.

Every entry of :data:`PUBLISHED` names a JSON file under docs/results/, the
command that produced it, and how far a re-run may differ: the simulator
runs on a virtual clock with seeded workloads, so its figures reproduce
exactly on the same code (a tolerance only for float formatting); live
benchmarks are noisy and get a wide one. A re-run writes to a scratch
folder, never over the published file, unless ``--update`` asks for it
(issue 23's rule). The diff walks both JSON trees and compares every
number, leaving out what measures this machine's speed rather than the
experiment (wall time, decision microseconds) and the provenance.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
import json
import math
from pathlib import Path
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

__all__ = ["PUBLISHED", "Published", "Moved", "diff_json", "reproduce"]

SIM_TOLERANCE = 1e-6
"""Relative: a seeded simulator run on the same code gives the same numbers."""

IGNORED = re.compile(r"(^|_)(wall_s|decision_us_p\d+|directory_query_us_p\d+|us_p50|us_p99)$|^(provenance|files|measured_at|replayed_from)$")
"""Keys whose values measure this machine (or say where files were), not the experiment."""


@dataclass(frozen=True)
class Published:
    name: str
    json_file: str
    """Under the results folder."""
    argv: tuple[str, ...]
    """``p2pinfer`` arguments; ``{out}`` is the scratch folder, ``{results}`` the results folder."""
    output: str
    """``stdout`` (the command prints the JSON) or a file name inside ``{out}``."""
    minutes: float
    """About how long it runs on a 2-core machine."""
    quick: bool = False
    """Part of ``--quick`` (CI: the whole quick set within 10 minutes)."""
    tolerance: float = SIM_TOLERANCE


def _replay(name: str) -> Published:
    return Published(
        f"{name}-replay", f"{name}-replay.json", ("bench", "swarm-replay", "{results}/" + f"{name}.json", "--cores", "2", "--json"),
        "stdout", 1.0, quick=True,
    )


def _sim(name: str, minutes: float, *extra: str, quick: bool = False, json_name: str | None = None) -> Published:
    return Published(
        name, json_name or f"{name}.json", ("simulate", "experiment", name.removesuffix("-quick"), *extra, "--out", "{out}"),
        f"{name.removesuffix('-quick')}.json", minutes, quick=quick,
    )


_DHT_FLAGS = ("--topic-size", "8", "--delta-interval", "2", "--full-interval", "120", "--load-interval", "5",
              "--peer-ttl", "30", "--warmup", "0.5", "--churn-interval", "2", "--loss", "0.01")
"""Issue 19's churned swarms (docs/results.md, "KadDHT's own traffic in the simulator")."""


def _dht(nodes: int, requests: int, variant: str, minutes: float, quick: bool = False) -> Published:
    """One ``simulate --json`` run of issue 19's KadDHT placement (or its oracle) with churn."""
    extra = {"oracle": ("--policy", "oracle"),
             "directory": ("--discovery", "directory", "--directory-placement", "kademlia", "--load-topics", "fill"),
             "directory-hashtopics": ("--discovery", "directory", "--directory-placement", "kademlia")}[variant]
    name = f"issue19-sim-dht-{nodes}-churn-{variant.replace('-hashtopics', '')}-{requests}"
    name += "-hashtopics" if variant.endswith("hashtopics") else ""
    return Published(name, f"{name}.json", ("simulate", "--nodes", str(nodes), "--requests", str(requests), *_DHT_FLAGS,
                                            *extra, "--json"), "stdout", minutes, quick=quick)


PUBLISHED: tuple[Published, ...] = (
    _sim("cost-vs-paper-quick", 3.0, "--quick", quick=True),
    _sim("cost-vs-paper", 20.0),
    _replay("swarm-1ms-run4"),
    _replay("swarm-1ms-run5"),
    _replay("swarm-50ms"),
    _replay("swarm-50ms-run2"),
    _replay("swarm-200ms"),
    # The live runs on later code (issue 23): three at 1 ms (fb669d6), three each at 50 and 200 ms (a92ad74).
    *(_replay(f"issue23-swarm-1ms-fb669d6-run{i}") for i in (1, 2, 3)),
    *(_replay(f"issue23-swarm-{ms}ms-a92ad74-run{i}") for ms in (50, 200) for i in (1, 2, 3)),
    _sim("load", 30.0, "--seeds", "3"),
    _sim("latency", 9.0),
    _sim("latency-fast", 9.0),
    _sim("skew", 6.0),
    _sim("specialisation", 5.0),
    _sim("hotspot", 8.0),
    _sim("ablations", 15.0),
    _sim("scale", 20.0),
    _dht(256, 4096, "directory", 0.3),
    _dht(256, 4096, "directory-hashtopics", 0.3, quick=True),
    _dht(1024, 16384, "directory", 1.0),
    _dht(1024, 16384, "directory-hashtopics", 1.0),
    _dht(1024, 16384, "oracle", 1.5),
    _dht(1024, 49152, "directory", 2.5),
    _dht(1024, 49152, "oracle", 5.0),
)


@dataclass(frozen=True)
class Moved:
    path: str
    published: Any
    now: Any

    def describe(self) -> str:
        return f"{self.path}: {self.published!r} -> {self.now!r}"


def _leaves(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if IGNORED.search(str(k)):
                continue
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, obj


def _close(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= tol * max(abs(a), abs(b)) + 1e-9


def diff_json(published: Any, now: Any, tolerance: float) -> list[Moved]:
    """Every published leaf (number, string, flag) that differs beyond
    ``tolerance`` (relative, numbers only) or is gone. A leaf only the new run
    has is a field added to the output since, not a figure that moved: see
    :func:`added_fields`."""
    old, new = dict(_leaves(published)), dict(_leaves(now))
    moved = [Moved(p, v, new.get(p)) for p, v in old.items() if p not in new or not _close(v, new[p], tolerance)]
    return sorted(moved, key=lambda m: m.path)


def added_fields(published: Any, now: Any) -> list[str]:
    """Leaves the new run has and the published file does not (output fields added since)."""
    old = dict(_leaves(published))
    return sorted(p for p, _ in _leaves(now) if p not in old)


def _run(entry: Published, results: Path, out: Path) -> dict[str, Any]:
    argv = [a.format(out=out, results=results) for a in entry.argv]
    proc = subprocess.run([sys.executable, "-m", "p2pinfer", *argv], capture_output=True, text=True)
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and entry.output == "stdout"):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"p2pinfer {' '.join(argv)} exited {proc.returncode}: " + " / ".join(tail))
    text = proc.stdout if entry.output == "stdout" else (out / entry.output).read_text()
    return json.loads(text)


def reproduce(
    results: Path, *, quick: bool = False, only: tuple[str, ...] = (), max_minutes: float = 60.0,
    update: bool = False, progress: Any = None,
) -> dict[str, Any]:
    """Re-run the chosen entries; per entry, the figures that moved."""
    chosen = [e for e in PUBLISHED if (e.name in only if only else (e.quick if quick else e.minutes <= max_minutes))]
    unknown = set(only) - {e.name for e in PUBLISHED}
    if unknown:
        raise ValueError(f"unknown experiments {sorted(unknown)}; choose from {', '.join(e.name for e in PUBLISHED)}")
    report = []
    for entry in chosen:
        path = results / entry.json_file
        row: dict[str, Any] = {"name": entry.name, "json": str(path), "command": "p2pinfer " + " ".join(entry.argv)}
        if progress is not None:
            progress(entry.name)
        if not path.exists():
            report.append({**row, "status": "missing", "moved": []})
            continue
        published = json.loads(path.read_text())
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="p2pinfer-reproduce-") as tmp:
            try:
                now = _run(entry, results, Path(tmp))
            except RuntimeError as exc:
                report.append({**row, "status": "error", "error": str(exc), "moved": []})
                continue
            moved = diff_json(published, now, entry.tolerance)
            if update and moved:
                from ..provenance import with_provenance

                argv = [a.format(out=results, results=results) for a in entry.argv]
                path.write_text(json.dumps(with_provenance({k: v for k, v in now.items() if k != "provenance"}, argv),
                                           indent=1) + "\n")
                if entry.output != "stdout":
                    for extra in Path(tmp).iterdir():  # the plot next to the JSON
                        if extra.suffix == ".png":
                            shutil.copy(extra, results / (Path(entry.json_file).stem + ".png"))
        report.append({
            **row, "status": "moved" if moved else "same", "wall_s": round(time.monotonic() - t0, 1),
            "tolerance": entry.tolerance, "moved_count": len(moved), "moved": [m.__dict__ for m in moved[:200]],
            "added_fields": added_fields(published, now)[:200],
            "updated": bool(update and moved),
        })
    return {"results": str(results), "quick": quick, "entries": report,
            "ok": all(r["status"] == "same" or r.get("updated") for r in report)}
