"""``p2pinfer lab reproduce``: the published simulator figures are today's code's figures."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from p2pinfer.cli.main import app
from p2pinfer.lab.reproduce import PUBLISHED, added_fields, diff_json

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_diff_reports_moved_and_missing_figures_apart_from_added_fields_and_ignores_machine_timings() -> None:
    old = {"a": 1.0, "b": [1, 2], "c": {"x": "cost"}, "wall_s": 3.0, "gone": 1, "decision_us_p50": 4.0}
    new = {"a": 1.0 + 1e-9, "b": [1, 3], "c": {"x": "paper"}, "wall_s": 9.0, "new": {"k": 2}, "decision_us_p50": 8.0}
    moved = {m.path: (m.published, m.now) for m in diff_json(old, new, 1e-6)}
    # A field the output gained since is not a published figure that moved; one that is gone is.
    assert moved == {"b[1]": (2, 3), "c.x": ("cost", "paper"), "gone": (1, None)}
    assert added_fields(old, new) == ["new.k"]
    assert diff_json(old, old, 0.0) == [] and added_fields(old, old) == []


def test_every_entry_has_its_published_file() -> None:
    assert any(e.quick for e in PUBLISHED)
    for e in PUBLISHED:
        assert (RESULTS / e.json_file).is_file(), e.json_file


def test_quick_reproduction_matches_the_published_json() -> None:
    """The CI form of issue 23's rule: re-running the quick set on this code
    gives the published figures (simulator runs are seeded, on a virtual clock)."""
    result = CliRunner().invoke(app, ["lab", "reproduce", "--quick", "--json", "--results", str(RESULTS)])
    report = json.loads(result.stdout)
    moved = {e["name"]: (e["status"], e["moved"][:5], e.get("error")) for e in report["entries"] if e["status"] != "same"}
    assert moved == {}
    assert result.exit_code == 0
    assert {e["name"] for e in report["entries"]} == {e.name for e in PUBLISHED if e.quick}
