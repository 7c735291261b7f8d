"""MMLU five-shot prompts: the paper's workload.

Per subject, the five dev examples form a header shared by every question of
that subject (the classic Hendrycks prompt); a request is that header plus
one test question. The header is the reusable prefix; the question is new
work. Subject popularity is uniform, Zipf or one hot subject.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
import importlib.resources
import io
import itertools
import lzma
from pathlib import Path
import random

from .base import Popularity, Prompt, WeightedChoice

__all__ = [
    "MMLUQuestion",
    "MMLUSubject",
    "MMLUWorkload",
    "format_question",
    "five_shot_header",
    "load_mmlu",
]

MMLU_OUTPUT_TOKENS = 1
"""A five-shot MMLU answer is one letter."""


@dataclass(frozen=True, slots=True)
class MMLUQuestion:
    question: str
    choices: tuple[str, str, str, str]
    answer: str


@dataclass(frozen=True, slots=True)
class MMLUSubject:
    name: str
    dev: tuple[MMLUQuestion, ...]
    test: tuple[MMLUQuestion, ...]

    @property
    def title(self) -> str:
        return self.name.replace("_", " ")


def _question(row: list[str], where: str) -> MMLUQuestion:
    if len(row) != 6 or row[5] not in ("A", "B", "C", "D"):
        raise ValueError(f"{where}: expected question,A,B,C,D,answer(A-D)")
    return MMLUQuestion(row[0], (row[1], row[2], row[3], row[4]), row[5])


def _rows(text: str, where: str) -> list[MMLUQuestion]:
    return [_question(row, f"{where} row {i + 1}") for i, row in enumerate(csv.reader(io.StringIO(text, newline="")))]


def _packaged_tests() -> dict[str, list[MMLUQuestion]]:
    """The shipped test rows: one xz-compressed CSV, subject first."""
    raw = (importlib.resources.files("p2pinfer") / "data" / "mmlu" / "test.csv.xz").read_bytes()
    out: dict[str, list[MMLUQuestion]] = {}
    for i, row in enumerate(csv.reader(io.StringIO(lzma.decompress(raw).decode("utf-8"), newline=""))):
        if not row:
            raise ValueError(f"test.csv.xz row {i + 1}: empty")
        out.setdefault(row[0], []).append(_question(row[1:], f"test.csv.xz row {i + 1}"))
    return out


def load_mmlu(path: str | Path | None = None, *, max_test: int | None = None) -> list[MMLUSubject]:
    """Subjects sorted by name.

    From ``path`` (Hendrycks layout: ``dev/<subject>_dev.csv`` and
    ``test/<subject>_test.csv``), or from the subset shipped in the package
    (all dev rows, the first 100 test rows of each subject).
    """
    root = importlib.resources.files("p2pinfer") / "data" / "mmlu" if path is None else Path(path)
    dev_dir = root / "dev"
    packaged = _packaged_tests() if path is None else None
    subjects: list[MMLUSubject] = []
    names = sorted(p.name[: -len("_dev.csv")] for p in dev_dir.iterdir() if p.name.endswith("_dev.csv"))
    if not names:
        raise FileNotFoundError(f"no <subject>_dev.csv files in {dev_dir}")
    for name in names:
        dev = _rows((dev_dir / f"{name}_dev.csv").read_text(encoding="utf-8"), f"{name}_dev.csv")
        if packaged is not None:
            test = packaged.get(name, [])
        else:
            test = _rows((root / "test" / f"{name}_test.csv").read_text(encoding="utf-8"), f"{name}_test.csv")
        if not dev or not test:
            raise ValueError(f"subject {name} has no dev or no test rows")
        subjects.append(MMLUSubject(name, tuple(dev), tuple(test[:max_test] if max_test else test)))
    return subjects


_ORDERS = list(itertools.permutations(range(4)))
"""The 24 orders of four choices, the original first."""


def _reorder(q: MMLUQuestion, order: tuple[int, ...]) -> MMLUQuestion:
    choices = tuple(q.choices[k] for k in order)
    answer = "ABCD"[order.index("ABCD".index(q.answer))]
    return MMLUQuestion(q.question, choices, answer)  # type: ignore[arg-type]


def format_question(q: MMLUQuestion, *, with_answer: bool) -> str:
    text = f"{q.question.strip()}\nA. {q.choices[0]}\nB. {q.choices[1]}\nC. {q.choices[2]}\nD. {q.choices[3]}\nAnswer:"
    return text + (f" {q.answer}\n\n" if with_answer else "")


def five_shot_header(subject: MMLUSubject) -> str:
    """The shared prefix: instruction plus the five answered dev examples."""
    intro = f"The following are multiple choice questions (with answers) about {subject.title}.\n\n"
    return intro + "".join(format_question(q, with_answer=True) for q in subject.dev)


class MMLUWorkload:
    """Draws five-shot prompts: a subject by popularity, then one of its test questions."""

    def __init__(
        self,
        subjects: list[MMLUSubject],
        popularity: Popularity | None = None,
        *,
        seed: int = 0,
        output_tokens: int = MMLU_OUTPUT_TOKENS,
    ) -> None:
        self.subjects = subjects
        self.popularity = popularity or Popularity()
        self.output_tokens = output_tokens
        self._headers = [five_shot_header(s) for s in subjects]
        order = list(range(len(subjects)))
        random.Random(f"mmlu-ranks-{seed}").shuffle(order)
        if self.popularity.item is not None:
            names = [s.name for s in subjects]
            if self.popularity.item not in names:
                raise ValueError(f"unknown subject {self.popularity.item!r}")
            top = names.index(self.popularity.item)
            order.remove(top)
            order.insert(0, top)
        self.ranked = [subjects[i].name for i in order]
        """Subject names by popularity rank, most popular first."""
        weights = self.popularity.weights(len(subjects))
        by_subject = [0.0] * len(subjects)
        for rank, i in enumerate(order):
            by_subject[i] = weights[rank]
        self.weights = by_subject
        """Probability of each subject (in ``subjects`` order)."""
        self._choice = WeightedChoice(by_subject)
        self._cycles: dict[int, list[int]] = {}
        self._cycle_no: dict[int, int] = {}

    def header(self, subject_index: int) -> str:
        return self._headers[subject_index]

    def prompt(self, subject_index: int, question_index: int, variant: int = 0) -> Prompt:
        """Subject header plus one test question; ``variant`` k > 0 presents
        the choices in the k-th other order (24 orders in all)."""
        subject = self.subjects[subject_index]
        q = subject.test[question_index % len(subject.test)]
        if variant % len(_ORDERS):
            q = _reorder(q, _ORDERS[variant % len(_ORDERS)])
        question = format_question(q, with_answer=False)
        return Prompt(subject.name, (self._headers[subject_index], question), output_tokens=self.output_tokens)

    def draw(self, rng: random.Random) -> Prompt:
        """A subject by popularity, then its next question.

        Each subject's questions come in a shuffled cycle; every later cycle
        presents the choices in another order (the usual MMLU permutation
        check), so a prompt repeats exactly only after 24 cycles. The
        question text itself is shared between cycles, as it would be.
        """
        i = self._choice.draw(rng)
        cycle = self._cycles.get(i)
        if not cycle:
            cycle = list(range(len(self.subjects[i].test)))
            rng.shuffle(cycle)
            self._cycles[i] = cycle
            self._cycle_no[i] = self._cycle_no.get(i, -1) + 1
        return self.prompt(i, cycle.pop(), self._cycle_no[i])

    def prompts(self, n: int, rng: random.Random) -> list[Prompt]:
        return [self.draw(rng) for _ in range(n)]
