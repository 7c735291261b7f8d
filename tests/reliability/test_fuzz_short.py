"""Short versions of `p2pinfer bench fuzz`: every decoder raises only its documented error."""

from __future__ import annotations

import pytest

from p2pinfer.lab.fuzz import TARGETS, fuzz_target, run_fuzz


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_decoders_reject_malformed_input_with_their_one_error(target: str) -> None:
    report = fuzz_target(target, 1500, seed=7)
    assert report.findings == []
    assert report.inputs == 1500 and report.rejected > 1000  # the mutations really are malformed
    assert report.peak_memory_bytes < 64 << 20


def test_every_peer_facing_decoder_is_a_fuzz_target() -> None:
    """A decoder added to the wire without a fuzz target is caught here."""
    import inspect

    from p2pinfer.core import digest, directory
    from p2pinfer.net import wire

    decoders = {name for module in (wire, digest, directory)
                for name, fn in inspect.getmembers(module, inspect.isfunction)
                if name.startswith("decode") and fn.__module__ == module.__name__}
    covered = set()
    for make in TARGETS.values():
        _, decode, _ = make()
        # A target passes the decoder itself, or a local ``decode`` that calls it.
        source = inspect.getsource(decode) if decode.__name__ == "decode" else ""
        covered |= {name for name in decoders if name == decode.__name__ or f"{name}(" in source}
    missing = decoders - covered
    assert not missing, f"decoders without a fuzz target: {sorted(missing)}"


def test_http_api_answers_malformed_bodies_with_4xx_and_keeps_serving() -> None:
    result = run_fuzz(["http"], 300, seed=5)
    (report,) = result["targets"]  # type: ignore[misc]
    assert report["findings"] == 0, report["finding_examples"]
    assert report["rejected_with_documented_error"] > 200 and report["node_alive_after"]
