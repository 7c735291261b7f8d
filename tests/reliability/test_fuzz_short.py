"""Short versions of `p2pinfer bench fuzz`: every decoder raises only its documented error."""

from __future__ import annotations

import pytest

from p2pinfer.lab.fuzz import fuzz_target, run_fuzz


@pytest.mark.parametrize("target", ["digest", "request", "response", "gossip", "check-request", "check-response"])
def test_decoders_reject_malformed_input_with_their_one_error(target: str) -> None:
    report = fuzz_target(target, 1500, seed=7)
    assert report.findings == []
    assert report.inputs == 1500 and report.rejected > 1000  # the mutations really are malformed
    assert report.peak_memory_bytes < 64 << 20


def test_http_api_answers_malformed_bodies_with_4xx_and_keeps_serving() -> None:
    result = run_fuzz(["http"], 300, seed=5)
    (report,) = result["targets"]  # type: ignore[misc]
    assert report["findings"] == 0, report["finding_examples"]
    assert report["rejected_with_documented_error"] > 200 and report["node_alive_after"]
