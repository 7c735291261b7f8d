"""The summary `p2pinfer bench conversations` reports, on rows written here (no swarm)."""

from __future__ import annotations

from p2pinfer.lab.conversations_bench import _summary


def _row(conv: int, turn: int, *, save: float, reused: int = 90, available: int | None = 100) -> dict:
    return {
        "conversation": conv, "turn": turn, "entry": 0, "served_by": 0, "ttft_ms": 100.0 * turn,
        "prompt_tokens": 120, "reused_tokens": reused, "completion_tokens": 50, "reply_save_ms": save,
        "previous_turn_tokens": available if turn > 1 else None,
        "reuse_of_previous_turn": reused / available if turn > 1 and available else None,
    }


def test_the_summary_reports_the_reply_save_time_per_turn_and_its_median() -> None:
    rows = [_row(0, 1, save=10.0), _row(1, 1, save=30.0), _row(0, 2, save=5.0), _row(1, 2, save=7.0),
            _row(2, 2, save=0.0)]
    out = _summary(rows)
    assert out["reply_save_ms_median"] == 7.0
    assert out["reply_save_ms_range"] == [0.0, 30.0]
    assert out["reply_save_ms_by_turn"] == {"1": 20.0, "2": 5.0}
    assert out["reuse_of_previous_turn"] == 0.9 and out["turns_2plus"] == 3
