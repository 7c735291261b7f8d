"""Workloads: five-shot headers, popularity, conversations, tokenizer choice."""

from __future__ import annotations

from collections import Counter
import random

import pytest

from p2pinfer.workloads import (
    ConversationWorkload,
    MMLUWorkload,
    PromptEncoder,
    five_shot_header,
    load_mmlu,
    load_tokenizer,
    parse_popularity,
)


@pytest.fixture(scope="module")
def subjects():  # type: ignore[no-untyped-def]
    return load_mmlu()


def test_packaged_subset_is_complete(subjects) -> None:  # type: ignore[no-untyped-def]
    assert len(subjects) == 57
    assert all(len(s.dev) == 5 and len(s.test) == 100 for s in subjects)
    algebra = next(s for s in subjects if s.name == "abstract_algebra")
    assert algebra.dev[0].question.startswith("Find all c in Z_3") and algebra.dev[0].answer == "B"


def test_five_shot_header_is_shared_within_a_subject(subjects) -> None:  # type: ignore[no-untyped-def]
    wl = MMLUWorkload(subjects, seed=1)
    enc = PromptEncoder(load_tokenizer("approx"))
    header = five_shot_header(subjects[3])
    assert header.count("\nAnswer: ") == 5 and subjects[3].title in header
    a, b = enc.encode(wl.prompt(3, 0)), enc.encode(wl.prompt(3, 1))
    n = len(enc.part(header, first=True))
    assert a[:n] == b[:n] and a[n:] != b[n:]
    other = enc.encode(wl.prompt(4, 0))
    common = next(i for i, (x, y) in enumerate(zip(a, other)) if x != y)
    assert common < 32  # different subjects part within the intro sentence


@pytest.mark.parametrize("s", [0.0, 1.0, 1.5])
def test_zipf_popularity(subjects, s: float) -> None:  # type: ignore[no-untyped-def]
    wl = MMLUWorkload(subjects, parse_popularity(f"zipf:{s}"), seed=2)
    rng = random.Random(3)
    counts = Counter(p.label for p in wl.prompts(20_000, rng))
    top = counts[wl.ranked[0]] / 20_000
    expected = 1 / sum(r ** -s for r in range(1, 58))
    assert top == pytest.approx(expected, rel=0.1)
    if s == 0.0:
        assert max(counts.values()) / min(counts.values()) < 1.6
    else:
        assert counts[wl.ranked[0]] > 3 * counts[wl.ranked[9]]


def test_prompts_do_not_repeat_before_24_cycles(subjects) -> None:  # type: ignore[no-untyped-def]
    wl = MMLUWorkload(subjects[:1], seed=1)
    seen = [p.parts[1] for p in wl.prompts(2400, random.Random(4))]
    assert len(set(seen)) == 2400  # 100 questions x 24 orders of the choices
    stems = [text.split("\nA. ")[0] for text in seen]
    assert set(stems[:100]) == set(stems[100:200]) and len(set(stems[:100])) == 100
    first, second = seen[:100], seen[100:200]
    q = subjects[0].test[0]
    assert sum(q.question.strip() in t for t in first) == sum(q.question.strip() in t for t in second) == 1
    assert not set(first) & set(second)


def test_hot_popularity_and_bad_specs(subjects) -> None:  # type: ignore[no-untyped-def]
    wl = MMLUWorkload(subjects, parse_popularity("hot:0.7:virology"), seed=2)
    counts = Counter(p.label for p in wl.prompts(5000, random.Random(1)))
    assert wl.ranked[0] == "virology" and counts["virology"] / 5000 == pytest.approx(0.7, abs=0.03)
    with pytest.raises(ValueError, match="unknown subject"):
        MMLUWorkload(subjects, parse_popularity("hot:0.7:astrology"))
    for bad in ("zipf", "zipf:-1", "hot:1.5", "pareto:1", "uniform:2"):
        with pytest.raises(ValueError):
            parse_popularity(bad)


def test_conversations_grow_by_extending_their_history(subjects) -> None:  # type: ignore[no-untyped-def]
    cw = ConversationWorkload(subjects, active=3, turns=(3, 3), seed=1)
    enc = PromptEncoder(load_tokenizer("approx"))
    by_conv: dict[str, list[list[int]]] = {}
    for p in cw.prompts(30, random.Random(2)):
        by_conv.setdefault(p.label, []).append(enc.encode(p))
    finished = [turns for turns in by_conv.values() if len(turns) == 3]
    assert finished
    for turns in finished:
        for earlier, later in zip(turns, turns[1:]):
            assert later[: len(earlier)] == earlier and len(later) > len(earlier)


def test_tokenizer_choice_is_stated() -> None:
    approx = load_tokenizer("approx")
    assert approx.name == "approx-v1" and approx.encode("Hello world") == approx.encode("Hello world")
    auto = load_tokenizer("auto")
    try:
        model = load_tokenizer("model")
    except RuntimeError:
        assert auto.name == "approx-v1"  # no model installed: the fallback, and it says so
    else:
        assert auto.name == model.name == "smollm2-gguf"
        text = "The following are multiple choice questions (with answers) about astronomy."
        assert 0 < len(model.encode(text)) < len(approx.encode(text))  # real BPE merges more
