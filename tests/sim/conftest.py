from __future__ import annotations

from typing import Any

import pytest

from p2pinfer.sim.runner import WorkloadSpec, build_requests


@pytest.fixture(scope="session")
def mmlu_300() -> tuple[WorkloadSpec, Any]:
    """300 seeded MMLU arrivals for a 4-node swarm (built once)."""
    spec = WorkloadSpec(requests=300)
    return spec, build_requests(spec, 4, 7)
