"""The package's layout as the architecture states it, read from the source.

* no import cycles between p2pinfer's modules (every import counts: at the
  top, inside a function, or under TYPE_CHECKING);
* the lab (p2pinfer/lab) is imported only by the lab itself and the CLI's
  lab commands (bench, demo, swarm, simulate experiment), never by the node;
* ``pip install p2pinfer`` without extras installs no numpy.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
from pathlib import Path
import re

from packaging.requirements import Requirement

PACKAGE = Path(__file__).resolve().parents[1] / "p2pinfer"
LAB_COMMANDS = re.compile(r"p2pinfer\.cli\.(bench_\w+|demo_cmd|swarm_cmd|sim_experiment|lab_\w+)$")


def modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the p2pinfer modules it imports (a package import counts as its __init__)."""
    mods = modules()

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, (path, is_pkg) in mods.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                targets = [target] + [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
            for t in targets:
                if t.split(".")[0] == "p2pinfer" and (k := known(t)) and k != mod:
                    edges.add(k)
        graph[mod] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_of_every_kind() -> None:
    graph = import_graph()
    assert "p2pinfer.core.router" in graph["p2pinfer.core.attempts"]  # top level, relative
    assert "p2pinfer.net.gossip" in graph["p2pinfer.node.wiring"]  # inside a function
    assert "p2pinfer.lab.sim_experiments" in graph["p2pinfer.cli.sim_experiment"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_package_has_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_only_the_lab_and_the_clis_lab_commands_import_the_lab() -> None:
    graph = import_graph()
    importers = {m for m, edges in graph.items() if any(e.startswith("p2pinfer.lab") for e in edges)}
    outside = sorted(m for m in importers if not m.startswith("p2pinfer.lab") and not LAB_COMMANDS.match(m))
    assert outside == []
    assert "p2pinfer.cli.bench_liar" in importers  # the rule has something to check


def test_the_node_never_reaches_the_lab() -> None:
    graph = import_graph()
    for root in ("p2pinfer.node", "p2pinfer.cli.node_cmd", "p2pinfer.api", "p2pinfer.sim.simulator"):
        seen, todo = set(), [root]
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += graph[m]
        assert not {m for m in seen if m.startswith("p2pinfer.lab")}, root


def test_a_plain_install_pulls_in_no_numpy() -> None:
    seen: set[str] = set()
    todo = ["p2pinfer"]
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        for line in md.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    assert "libp2p" in seen and "numpy" not in seen
    lab = [Requirement(r) for r in md.requires("p2pinfer") or [] if Requirement(r).name == "numpy"]
    assert lab and all(r.marker is not None and r.marker.evaluate({"extra": "lab"}) for r in lab)
