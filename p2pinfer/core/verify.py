"""Checking a peer's answer against this node's own model, without I/O.

A peer that serves a forwarded request may return wrong tokens: another
(cheaper) model than it claims, a broken build, garbage. The origin can
check an answer with one prefill of prompt + answer on its own engine
(:meth:`~p2pinfer.engines.base.Engine.score`), which gives, for each
returned token, its log-probability and the most likely token at that
position given the tokens *the peer returned* before it (teacher forcing:
one honest near-tie that went the other way does not make every later
token look wrong). :func:`judge` turns those scores into a
:class:`Verdict`:

* **greedy** (temperature 0): every returned token must be the argmax
  within ``greedy_tolerance`` nats (``best_logprob - logprob``). Builds,
  thread counts, batch sizes and flash attention change the logits a
  little, so bit-identity is not the test; the tolerance is what separates
  those honest differences from another model (measured: docs/results.md,
  issue 21);
* **sampling**: a log-likelihood test over the answer. Under the model at
  the request's temperature, the sum of the returned tokens'
  log-probabilities has a known mean (minus the summed entropies) and
  variance; an answer whose sum lies more than ``sampling_z`` standard
  deviations below it is rejected. Honest top-k/top-p sampling only raises
  the sum (it drops unlikely tokens), so the test is one-sided.

Grammar-constrained and penalised requests are not checked (the engine's
raw distribution is not what they sample from), nor answers of no token.

:class:`SpotChecks` decides which answers are checked: every answer of a
peer *on probation* (the first ``probation_answers`` answers it gives this
node, and again after a failed check), whose first ``probation_hold_tokens``
tokens are held back from the client until checked, so that an answer wrong
from its start is never shown and the request continues elsewhere from the
last verified token (the rest then streams and the whole answer is checked
at its end); and a ``fraction`` of the others, checked once they have been
streamed (a failure then sanctions the peer but cannot take back what the
client saw). Those spot checks have a **budget**: a drawn spot check is
skipped while the tokens spot checks have evaluated exceed ``budget`` times
the tokens this node's engine evaluated serving requests (prompt tokens not
taken from the cache, plus generated ones), so that checking never takes
more than about that share of the node's work, whatever the checks cost
(a cold check of a long prompt costs many answers' worth). Probation checks
are outside the budget: they are the defence against a new peer.

**Who checks** (:func:`pick_verifier`): a spot check is prefill of prompt +
answer, cheap where the prompt's prefix is cached. When a peer other than
the one that answered holds more of the prompt's prefix than this node
(by its digest), has passed this node's own checks, and is not busy or
distrusted, the origin asks it for the scores (``/p2pinfer/check/1.0.0``)
and judges them itself; a failed verdict is confirmed on the origin's own
engine before anyone is distrusted, so a lying verifier cannot frame an
honest peer (it is distrusted instead). Probation checks always run on the
origin: a verifier that colludes with the peer it checks could pass its
lies, so the defence against a new peer does not rest on a third one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence, Set as AbstractSet
from dataclasses import dataclass
import math
import random
from typing import Literal, Protocol

__all__ = [
    "MAX_DELEGATED_CHECK_TOKENS",
    "CheckPlan",
    "SpotChecks",
    "Verdict",
    "VerifyConfig",
    "checkable",
    "judge",
    "pick_verifier",
]


class Scored(Protocol):
    """One position's score (:class:`~p2pinfer.engines.base.PositionScore`)."""

    @property
    def token_id(self) -> int: ...
    @property
    def logprob(self) -> float: ...
    @property
    def best_logprob(self) -> float: ...
    @property
    def mean_logprob(self) -> float: ...
    @property
    def var_logprob(self) -> float: ...


class Sampling(Protocol):
    """What :func:`judge` reads of a request's parameters (:class:`~p2pinfer.engines.base.GenerationParams`)."""

    @property
    def temperature(self) -> float: ...
    @property
    def grammar(self) -> str | None: ...
    @property
    def penalised(self) -> bool: ...


MAX_DELEGATED_CHECK_TOKENS = 512
"""The most answer tokens a check scored by a third peer carries (the
``/p2pinfer/check/1.0.0`` limit, ``net.wire.CHECK_MAX_ANSWER_TOKENS``)."""


@dataclass(frozen=True, slots=True)
class VerifyConfig:
    """How a node checks forwarded answers (setting ``verify_fraction``)."""

    fraction: float = 0.1
    """Share of forwarded answers from trusted peers that are checked (0 = none,
    1 = every answer). Answers of peers on probation are always checked."""
    probation_answers: int = 2
    """Answers of a new peer (and of a peer after a failed check) that are
    checked before release; 0 turns probation off."""
    probation_hold_tokens: int = 16
    """A probation answer's first this many tokens are held and checked on
    their own; once they pass they are released, the rest streams, and the
    whole answer is checked at its end (its pass or failure is the probation
    verdict). So a client waits one check of prompt + 16 tokens, not the
    whole answer plus its check; a peer that answers the window honestly and
    then lies has its lie shown once per origin before it is distrusted.
    0: the whole answer is held until checked."""
    greedy_tolerance: float = 0.5
    """Nats by which a greedy token may fall short of the argmax."""
    sampling_z: float = 6.0
    """Standard deviations below the expected log-likelihood that reject a sampled answer."""
    budget: float = 0.05
    """Spot checks' share of this node's engine work (tokens evaluated for
    checks against tokens evaluated serving requests; setting
    ``verify_budget``): a spot check drawn over it is skipped. 1 or more: no
    limit. Probation checks are not limited."""
    max_checked_tokens: int = 512
    """Only the first this many tokens of an answer are checked (the cost of a
    check is capped); at most :data:`MAX_DELEGATED_CHECK_TOKENS` while ``delegate`` is on."""
    remembered_peers: int = 4096
    """Peers whose probation this node remembers (the oldest is forgotten first)."""
    delegate: bool = True
    """Whether a spot check may run on a third peer that holds more of the
    prompt's prefix than this node (:func:`pick_verifier`; setting
    ``verify_delegate``). Probation checks always run here."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"verify_fraction must be in 0..1 (got {self.fraction})")
        if self.probation_answers < 0 or self.probation_hold_tokens < 0:
            raise ValueError("probation_answers and probation_hold_tokens must be >= 0")
        if not self.budget >= 0.0:
            raise ValueError(f"verify_budget must be >= 0 (got {self.budget})")
        if not self.greedy_tolerance > 0 or not self.sampling_z > 0:
            raise ValueError("greedy_tolerance and sampling_z must be positive")
        if self.max_checked_tokens < 1 or self.remembered_peers < 1:
            raise ValueError("max_checked_tokens and remembered_peers must be >= 1")
        if self.delegate and self.max_checked_tokens > MAX_DELEGATED_CHECK_TOKENS:
            raise ValueError(
                f"max_checked_tokens {self.max_checked_tokens} is more than a delegated check carries "
                f"({MAX_DELEGATED_CHECK_TOKENS}, /p2pinfer/check/1.0.0): lower it, or turn verify_delegate off")

    @property
    def enabled(self) -> bool:
        return self.fraction > 0 or self.probation_answers > 0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a check found."""

    ok: bool
    checked_tokens: int
    verified_tokens: int
    """Leading tokens that passed (all of them when ``ok``): where a rejected
    answer can be continued from."""
    test: Literal["greedy", "sampling"]
    statistic: float
    """Greedy: the largest shortfall from the argmax, in nats. Sampling: the z-score."""
    reason: str = ""


def checkable(params: Sampling) -> str | None:
    """Why an answer to a request with these parameters cannot be checked, or ``None``."""
    if params.grammar is not None:
        return "a grammar constrains its tokens"
    if params.penalised:
        return "penalties change its distribution"
    return None


def judge(scores: Sequence[Scored], params: Sampling, config: VerifyConfig) -> Verdict:
    """The verdict on an answer, from its tokens' scores under our model.

    ``scores`` must come from ``Engine.score`` at temperature 1 for a greedy
    request and at the request's temperature for a sampled one.
    """
    if not scores:
        raise ValueError("nothing to judge: the answer has no token")
    n = len(scores)
    if params.temperature <= 0.0:
        worst = 0.0
        for i, s in enumerate(scores):
            gap = s.best_logprob - s.logprob
            if gap > config.greedy_tolerance:
                return Verdict(False, n, i, "greedy", gap,
                               f"token {i} of the answer ({s.token_id}) is {gap:.2f} nats below the most likely token "
                               f"(tolerance {config.greedy_tolerance:g})")
            worst = max(worst, gap)
        return Verdict(True, n, n, "greedy", worst)
    observed = sum(s.logprob for s in scores)
    expected = sum(s.mean_logprob for s in scores)
    variance = sum(s.var_logprob for s in scores)
    z = (observed - expected) / math.sqrt(variance) if variance > 0 else (0.0 if observed >= expected else -math.inf)
    if z >= -config.sampling_z:
        return Verdict(True, n, n, "sampling", z)
    # Where a continuation can start: the longest prefix that still passes on its own.
    verified = _longest_passing_prefix(scores, config.sampling_z)
    return Verdict(False, n, verified, "sampling", z,
                   f"the answer's log-likelihood is {z:.1f} standard deviations below what the model gives "
                   f"(threshold -{config.sampling_z:g})")


def _longest_passing_prefix(scores: Sequence[Scored], z_max: float) -> int:
    obs = exp = var = 0.0
    best = 0
    for i, s in enumerate(scores):
        obs += s.logprob
        exp += s.mean_logprob
        var += s.var_logprob
        if var > 0 and (obs - exp) / math.sqrt(var) >= -z_max:
            best = i + 1
    return best


CheckPlan = Literal["hold", "after", "none"]
"""``hold``: check before the client sees it; ``after``: check once streamed; ``none``."""


class SpotChecks:
    """Which forwarded answers this node checks; see the module docstring.

    Per peer it remembers how many checks the peer has passed here (at most
    ``remembered_peers`` peers, least recently seen forgotten first: a
    forgotten peer is on probation again, the safe side).
    """

    def __init__(self, config: VerifyConfig, rng: random.Random | None = None) -> None:
        self.config = config
        self.rng = rng or random.Random()
        self._passed: OrderedDict[str, int] = OrderedDict()
        self.checks = 0
        self.failures = 0
        self.checked_tokens = 0
        self.windows_passed = 0
        """Probation windows (``probation_hold_tokens``) that passed; their answers are checked again whole."""
        self.served_tokens = 0
        """Tokens this node's engine evaluated serving requests (:meth:`note_served`)."""
        self.spot_tokens = 0
        """Tokens its engine evaluated for spot checks (:meth:`note_spot_check`)."""
        self.spot_checks_drawn = 0
        self.spot_checks_over_budget = 0
        """Spot checks drawn but skipped because checks had used their budget."""

    def on_probation(self, peer: str) -> bool:
        return self._passed.get(peer, 0) < self.config.probation_answers

    def plan(self, peer: str) -> CheckPlan:
        """How the next answer from ``peer`` is checked (draws the spot check)."""
        if not self.config.enabled:
            return "none"
        if self.on_probation(peer):
            return "hold"
        if self.rng.random() >= self.config.fraction:
            return "none"
        self.spot_checks_drawn += 1
        if self.over_budget():
            self.spot_checks_over_budget += 1
            return "none"
        return "after"

    def over_budget(self) -> bool:
        """Whether spot checks have used their share of the work (a check may
        start at the limit and end over it; the next waits until serving catches up)."""
        return self.config.budget < 1.0 and self.spot_tokens > self.config.budget * self.served_tokens

    def note_served(self, evaluated_tokens: int) -> None:
        """A request served here: the tokens its engine evaluated (prompt not from the cache, and generated)."""
        self.served_tokens += max(0, evaluated_tokens)

    def note_spot_check(self, evaluated_tokens: int) -> None:
        """A spot check's tokens evaluated (prompt not from the cache, and the answer)."""
        self.spot_tokens += max(0, evaluated_tokens)

    def record(self, peer: str, verdict: Verdict, *, window: bool = False) -> None:
        """A check's outcome: a pass counts towards probation, a failure restarts it.
        ``window``: the check of a probation window; its pass is not yet a passed
        answer (only the whole answer's check counts), its failure is one."""
        if window and verdict.ok:
            self.windows_passed += 1
            return
        self.checks += 1
        self.checked_tokens += verdict.checked_tokens
        passed = self._passed.pop(peer, 0)
        if verdict.ok:
            self._passed[peer] = passed + 1
        else:
            self.failures += 1
            self._passed[peer] = 0
        while len(self._passed) > self.config.remembered_peers:
            self._passed.popitem(last=False)

    def passed(self, peer: str) -> int:
        return self._passed.get(peer, 0)

    def restart_probation(self, peer: str) -> None:
        """``peer`` misbehaved other than in an answer (a verifier's wrong scores): on probation again."""
        self._passed.pop(peer, None)
        self._passed[peer] = 0


class VerifierCandidate(Protocol):
    """What :func:`pick_verifier` reads of a peer (:class:`~p2pinfer.core.peers.PeerState`)."""

    @property
    def peer_id(self) -> str: ...
    @property
    def load(self) -> "WaitReport": ...


class WaitReport(Protocol):
    def wait_ms(self) -> float: ...


def pick_verifier(
    matches: Mapping[str, int],
    own_blocks: int,
    candidates: Callable[[str], VerifierCandidate | None],
    exclude: AbstractSet[str],
) -> str | None:
    """The peer to score a spot check, or ``None`` to check here.

    ``matches``: peers holding a prefix of the prompt -> blocks held (the
    peer view's :meth:`~p2pinfer.core.peers.PeerView.longest_matches`);
    ``own_blocks``: blocks of it this node's cache holds; ``candidates``: the
    peer's state when it may verify (same model, not busy, not distrusted,
    past its probation here), else ``None``; ``exclude``: the peer whose
    answer is checked. Only a peer holding more blocks than this node is
    worth asking (a check elsewhere costs the swarm as much as here, plus a
    round trip); among those, the longest match, then the shortest wait.
    """
    best: tuple[int, float, str] | None = None
    for peer, blocks in matches.items():
        if blocks <= own_blocks or peer in exclude:
            continue
        state = candidates(peer)
        if state is None:
            continue
        key = (-blocks, state.load.wait_ms(), peer)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]
