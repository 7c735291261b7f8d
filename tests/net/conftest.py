"""Fixtures that start real nodes, each in its own process, on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from p2pinfer.net.config import NodeConfig
from p2pinfer.lab.node_process import NodeProcess, fast_config, wait_until


class Cluster:
    """Node B first, then the others bootstrapping from B only."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.nodes: dict[str, NodeProcess] = {}

    def start(self, name: str, config: NodeConfig) -> NodeProcess:
        node = NodeProcess(config, name, log_dir=self.log_dir)
        self.nodes[name] = node
        return node

    def start_many(self, configs: dict[str, NodeConfig]) -> list[NodeProcess]:
        with ThreadPoolExecutor(len(configs)) as pool:
            futures = {name: pool.submit(NodeProcess, cfg, name, self.log_dir) for name, cfg in configs.items()}
            for name, fut in futures.items():
                self.nodes[name] = fut.result()
        return [self.nodes[name] for name in configs]

    def __getitem__(self, name: str) -> NodeProcess:
        return self.nodes[name]

    def wait_full_view(self, names: list[str], timeout_s: float = 20.0) -> None:
        """Until every named node sees every other one as eligible, and is connected to it."""
        ids = {n: self.nodes[n].peer_id for n in names}

        def done() -> bool:
            for n in names:
                view = self.nodes[n].call("view")
                connected = set(self.nodes[n].call("status")["connected_peers"])
                for other in names:
                    if other != n and not (view.get(ids[other], {}).get("eligible") and ids[other] in connected):
                        return False
            return True

        wait_until(done, timeout_s, interval_s=0.1, what=f"full view and full mesh among {names}")

    def close(self) -> dict[str, int]:
        codes = {}
        for name, node in self.nodes.items():
            codes[name] = node.close()
        return codes

    def logs(self) -> str:
        return "\n".join(f"--- {n} ---\n{node.log_tail()}" for n, node in self.nodes.items())

    def three(self, **overrides: dict) -> tuple[NodeProcess, NodeProcess, NodeProcess]:
        """A and C bootstrap from B only; per-node ``fast_config`` overrides by name."""
        b = self.start("B", fast_config(**overrides.get("B", {})))
        a, c = self.start_many(
            {
                "A": fast_config(bootstrap=(b.addr,), **overrides.get("A", {})),
                "C": fast_config(bootstrap=(b.addr,), **overrides.get("C", {})),
            }
        )
        self.wait_full_view(["A", "B", "C"])
        return a, b, c


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()

