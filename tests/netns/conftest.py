"""One NATed namespace testbed for the module, with a real node process on every host.

Needs root, ``ip`` and ``iptables`` (``.ci/run`` installs iptables). Where
they are missing the tests *fail* and say why: a NAT test that cannot run
has not passed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from p2pinfer.lab.nat_bench import NatSwarm
from p2pinfer.lab.nat_testbed import NatTestbed, NatTestbedUnavailable

NAT_CONFIG = {"reachability_interval_s": 60.0}


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatSwarm]:
    """Three public relays (pub0 bootstraps) and two volunteers, each holding reservations on
    two of them: ``cone`` behind a port-preserving NAT (plain MASQUERADE), ``sym`` behind a
    symmetric one (MASQUERADE --random-fully)."""
    try:
        NatTestbed.check_available()
    except NatTestbedUnavailable as exc:
        pytest.fail(f"the NAT testbed cannot run here: {exc}", pytrace=False)
    log_dir: Path = tmp_path_factory.mktemp("netns-logs")
    with NatTestbed(public=3, nats=("cone", "symmetric"), hosts_per_nat=(1, 1)) as bed:
        nodes = NatSwarm(bed, speed=1.0, nat=NAT_CONFIG, log_dir=log_dir)
        try:
            nodes.settle(wanted_reservations=2, timeout_s=240)
            yield nodes
        finally:
            nodes.close()
