"""Identity files, node configuration, and the generated protobuf code."""

from __future__ import annotations

import os
import stat

import pytest

from p2pinfer.core.router import GossipConfig, RouterConfig
from p2pinfer.net.config import ConfigError, NodeConfig
from p2pinfer.net.host import derive_psk
from p2pinfer.net.identity import IdentityError, load_or_create_identity
from p2pinfer.net.proto import generate


def test_identity_is_created_private_and_reloaded(tmp_path):
    path = tmp_path / "keys" / "node.key"
    first = load_or_create_identity(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_identity(path)
    assert again.public_key.to_bytes() == first.public_key.to_bytes()
    assert load_or_create_identity(None).public_key.to_bytes() != first.public_key.to_bytes()


def test_identity_file_readable_by_others_is_refused(tmp_path):
    path = tmp_path / "node.key"
    load_or_create_identity(path)
    os.chmod(path, 0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        load_or_create_identity(path)


def test_identity_file_with_garbage_is_refused(tmp_path):
    path = tmp_path / "node.key"
    path.write_bytes(b"not a key")
    os.chmod(path, 0o600)
    with pytest.raises(IdentityError, match="does not hold a libp2p private key"):
        load_or_create_identity(path)


def test_config_round_trips_through_json_form():
    config = NodeConfig(
        listen=("/ip4/127.0.0.1/tcp/0",),
        bootstrap=("/ip4/10.0.0.1/tcp/4001/p2p/12D3KooWPeer",),
        engine_options={"speed": 0.5},
        router=RouterConfig(policy="paper", gossip=GossipConfig(delta_interval_s=0.1)),
        swarm_secret=b"s3cret",
        private_network=True,
    )
    assert NodeConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"bootstrap": ("/ip4/10.0.0.1/tcp/4001",)}, "lacks /p2p/"),
        ({"private_network": True}, "needs swarm_secret"),
        ({"listen": ()}, "at least one"),
        ({"max_hops": 0}, "max_hops"),
        ({"max_frame_bytes": 10}, "max_frame_bytes"),
        ({"stall_timeout_s": 0}, "stall_timeout_s"),
    ],
)
def test_impossible_configs_say_why(changes, words):
    with pytest.raises(ConfigError, match=words):
        NodeConfig(**changes)
    with pytest.raises(ConfigError, match="unknown node config keys: bogus"):
        NodeConfig.from_dict({"bogus": 1})


def test_psk_is_derived_from_the_secret_and_separate_from_it():
    assert len(derive_psk(b"a")) == 64
    assert derive_psk(b"a") == derive_psk(b"a") != derive_psk(b"b")
    assert b"a".hex() not in derive_psk(b"a")


def test_checked_in_protobuf_code_is_current():
    assert generate.check() == []
