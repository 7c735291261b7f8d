"""Issue 21, part 4: does a TOPLOC-style commitment let a verifier check an answer with less work?

Run from the repository root, under the benchmark lock::

    flock /work/notes/bench.lock nice -n 19 python docs/results/issue21-toploc/measure.py \
        --prompts 3 --max-tokens 96 --out docs/results/issue21-toploc/run1.json

On MMLU five-shot prompts (the paper's workload), prompt by prompt. An honest
"server" (a llama.cpp runtime of SmolLM2-135M-Instruct Q4_1, 1 thread)
decodes a greedy answer of ``--max-tokens`` token by token (an end of
generation is fed on, as TOPLOC's experiments ignore EOS: MMLU's own greedy
answers are one letter, shorter than one block) and, per block of ``--block``
(32) answer tokens, commits to

* ``hidden``: TOPLOC's fingerprint: the top-128 values (by magnitude) of the
  last hidden state (after the final norm) over the block's positions,
  compared as TOPLOC's validator does (bf16 exponent matches >= 90 of 128,
  mantissa error mean <= 10 and median <= 8); 258 bytes per block in TOPLOC's
  polynomial encoding;
* ``logits``: the top-``--topk`` (8) tokens of the row that produced the
  block's last token, with their log-probabilities (uint16 id + fp16: 4 bytes
  each), passing when each is within 0.5 nats of the verifier's.

Then, side by side:

(a) **the current check**, ``Engine.score`` of prompt + answer on a real
    ``LlamaCppEngine`` (its defaults: 2 threads, batch 128, flash attention
    off, as on both runtimes), the prompt cached
    (by a one-token generation) and cold.
(b) a "verifier" runtime configured like the engine checks each answer, the
    prompt cached (a warm-up, then each variant twice, interleaved) and cold:

    * ``tokens``: the current check on the runtime: the logits of every answer
      row, each reduced to its score (``llama_score._row_score``) and judged
      (``verify.judge``);
    * ``logits``: the same tokens evaluated, the logits of one row per block;
    * ``hidden``: the same tokens evaluated, the hidden states of every answer row;
    * a sampled block j (every j, prompt cached): everything up to the end of
      block j evaluated, the rows of block j read (``tokens``: its rows;
      ``logits``: its last row).

    Work is counted in tokens evaluated and rows read (independent of the
    machine's load); seconds are wall time.

Untimed, to find what a verifier must evaluate: block b's commitments and token
check recomputed without the earlier answer blocks (block b right after the
prompt, and block b alone from position 0); and two liars that return random
tokens: with commitments computed over them by the real model (one prefill,
cheaper than decoding), and with the honest answer's commitments.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import trio

TOPLOC_K = 128
TOPLOC_EXP_MIN, TOPLOC_MANT_MEAN, TOPLOC_MANT_MEDIAN = 90, 10.0, 8.0
LOGIT_TOL = 0.5
TOPLOC_BYTES_PER_BLOCK = 258  # the paper's polynomial encoding of 128 bf16 values


# -- the honest server: greedy answers with their commitments ------------------------------------
def evaluate(rt: Any, tokens: Sequence[int], pos0: int, want: Callable[[int], bool],
             read: Callable[[int, int], None], *, embeddings: bool = False) -> int:
    """Evaluate ``tokens`` at ``pos0...`` of sequence 0 in the runtime's chunks, with
    outputs for the tokens whose index ``i`` (into ``tokens``) ``want(i)``;
    ``read(i, row)`` is called for each. Returns the rows read. ``embeddings``:
    hidden states too, in the batches with a wanted row (llama.cpp then
    outputs every row of such a batch: in a cold check, up to one batch of
    prompt rows more than are read)."""
    import llama_cpp as ll

    outputs = 0
    for off, n in rt.chunks(len(tokens)):
        # With hidden states on, llama.cpp outputs every row of the batch: on only where one is wanted.
        ll.llama_set_embeddings(rt.ctx, embeddings and any(want(off + j) for j in range(n)))
        b = rt._batch
        b.n_tokens = n
        for j in range(n):
            b.token[j] = tokens[off + j]
            b.pos[j] = pos0 + off + j
            b.n_seq_id[j] = 1
            b.seq_id[j][0] = 0
            b.logits[j] = want(off + j)
        if ll.llama_decode(rt.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        for j in range(n):
            if want(off + j):
                read(off + j, j)
                outputs += 1
    return outputs


def logits_row(rt: Any, row: int) -> np.ndarray:
    import llama_cpp as ll

    return np.ctypeslib.as_array(ll.llama_get_logits_ith(rt.ctx, row), shape=(rt.n_vocab,)).copy()


def hidden_row(rt: Any, row: int) -> np.ndarray:
    import llama_cpp as ll

    n_embd = ll.llama_model_n_embd(rt.model)
    return np.ctypeslib.as_array(ll.llama_get_embeddings_ith(rt.ctx, row), shape=(n_embd,)).copy()


def blocks_of(n: int, block: int) -> list[tuple[int, int]]:
    """[start, end) of each block of an answer of ``n`` tokens."""
    return [(s, min(s + block, n)) for s in range(0, n, block)]


def bf16_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bits = x.astype(np.float32).view(np.uint32)
    b16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return (b16 >> 7) & 0xFF, b16 & 0x7F


def hidden_commit(h: np.ndarray) -> dict[int, float]:
    """TOPLOC's fingerprint of a block's hidden states (rows x n_embd): its top-128 by magnitude."""
    flat = h.reshape(-1)
    idx = np.argpartition(-np.abs(flat), TOPLOC_K - 1)[:TOPLOC_K]
    return {int(i): float(flat[i]) for i in idx}


def hidden_check(commit: dict[int, float], h: np.ndarray) -> dict[str, Any]:
    """TOPLOC's comparison: the verifier's own top-128 looked up in the commitment."""
    mine = hidden_commit(h)
    common = [i for i in mine if i in commit]
    exp_hits, mean, median = 0, 128.0, 128.0
    if common:
        e1, m1 = bf16_parts(np.array([mine[i] for i in common]))
        e2, m2 = bf16_parts(np.array([commit[i] for i in common]))
        same = e1 == e2
        errs = np.abs(m1.astype(int) - m2.astype(int))[same]
        exp_hits = int(same.sum())
        if len(errs):
            mean, median = float(errs.mean()), float(np.median(errs))
    ok = exp_hits >= TOPLOC_EXP_MIN and mean <= TOPLOC_MANT_MEAN and median <= TOPLOC_MANT_MEDIAN
    return {"ok": ok, "topk_hits": len(common), "exp_hits": exp_hits, "mant_err_mean": mean, "mant_err_median": median}


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    peak = z.max()
    return z - (peak + np.log(np.exp(z - peak).sum()))


def logit_commit(z: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The top-k tokens of a row and their log-probabilities (fp16 on the wire):
    log-probabilities, not raw logits, which move together by more (measured)."""
    lp = log_softmax(z)
    idx = np.argsort(-lp)[:k]
    return [(int(i), float(np.float16(lp[i]))) for i in idx]


def logit_check(commit: list[tuple[int, float]], z: np.ndarray) -> dict[str, Any]:
    k = len(commit)
    lp = log_softmax(z)
    diff = max(abs(float(lp[i]) - v) for i, v in commit)
    mine = {int(i) for i in np.argsort(-z)[:k]}
    return {"ok": diff <= LOGIT_TOL, "max_diff": diff, "topk_overlap": len(mine & {i for i, _ in commit}),
            "top1_equal": int(z.argmax()) == commit[0][0]}


def commitments(hidden: np.ndarray, logits: dict[int, np.ndarray], n: int, block: int, k: int) -> dict[str, Any]:
    return {"hidden": [hidden_commit(hidden[s:e]) for s, e in blocks_of(n, block)],
            "logits": [logit_commit(logits[e - 1], k) for _, e in blocks_of(n, block)]}


def serve(rt: Any, prompt: list[int], n: int, block: int, k: int) -> tuple[list[int], dict[str, Any]]:
    """An honest server: a greedy answer of ``n`` tokens decoded token by token (an
    end of generation is fed on, as TOPLOC's experiments ignore EOS), with its
    commitments taken while decoding. Leaves ``prompt[:-1]`` in sequence 0."""
    import llama_cpp as ll

    P = len(prompt)
    rt.clear_seq(0)
    evaluate(rt, prompt[:-1], 0, lambda i: False, lambda i, r: None)
    ll.llama_set_embeddings(rt.ctx, True)
    hidden = np.zeros((n, ll.llama_model_n_embd(rt.model)), np.float32)
    logits: dict[int, np.ndarray] = {}
    ends = {e - 1 for _, e in blocks_of(n, block)}
    answer: list[int] = []
    last = prompt[-1]
    for i in range(n):  # the row that predicts answer[i] has input (prompt + answer)[P - 1 + i]
        rt.decode([(0, last, P - 1 + i)])
        hidden[i] = hidden_row(rt, 0)
        z = logits_row(rt, 0)
        if i in ends:
            logits[i] = z
        last = int(z.argmax())
        answer.append(last)
    rt.truncate_seq(0, P - 1)
    return answer, commitments(hidden, logits, n, block, k)


def commit_by_prefill(rt: Any, prompt: list[int], answer: list[int], block: int, k: int) -> dict[str, Any]:
    """A liar's commitments to tokens it did not decode: one prefill of them by the
    real model (``prompt[:-1]`` already in sequence 0; left so)."""
    P, n = len(prompt), len(answer)
    import llama_cpp as ll

    hidden = np.zeros((n, ll.llama_model_n_embd(rt.model)), np.float32)
    logits: dict[int, np.ndarray] = {}
    ends = {e - 1 for _, e in blocks_of(n, block)}

    def read(i: int, row: int) -> None:
        hidden[i] = hidden_row(rt, row)
        if i in ends:
            logits[i] = logits_row(rt, row)
    evaluate(rt, [prompt[-1]] + answer[:-1], P - 1, lambda i: True, read, embeddings=True)
    rt.truncate_seq(0, P - 1)
    return commitments(hidden, logits, n, block, k)


# -- part (a): the product's check ---------------------------------------------------------
async def engine_part(prompts: list[list[int]], answers: list[list[int]]) -> tuple[list[dict[str, Any]], int, int]:
    from p2pinfer.core.verify import VerifyConfig, judge
    from p2pinfer.engines.base import GenerationParams
    from p2pinfer.engines.llama_cpp import LlamaCppEngine

    engine = LlamaCppEngine(context_size=4096, reply_cache=False)
    rows = []
    try:
        for prompt, out in zip(prompts, answers):
            engine.cache.clear()
            async for _ in engine.generate(prompt, GenerationParams(max_tokens=1)):  # caches the prompt
                pass
            tokens = prompt + out
            p0 = engine.check_tokens_prefilled
            t0 = time.perf_counter()
            warm = await engine.score(tokens, len(prompt))
            warm_s = time.perf_counter() - t0
            p1 = engine.check_tokens_prefilled
            engine.cache.clear()
            t0 = time.perf_counter()
            cold = await engine.score(tokens, len(prompt))
            cold_s = time.perf_counter() - t0
            p2 = engine.check_tokens_prefilled
            vw, vc = judge(warm, GenerationParams(), VerifyConfig()), judge(cold, GenerationParams(), VerifyConfig())
            rows.append({
                "prompt_tokens": len(prompt), "answer_tokens": len(out),
                "cached_s": warm_s, "cold_s": cold_s,
                "cached_evaluated_tokens": p1 - p0, "cold_evaluated_tokens": p2 - p1,
                "cached_ok": vw.ok, "cold_ok": vc.ok, "cached_reason": vw.reason, "cold_reason": vc.reason,
                "cached_worst_gap": vw.statistic,
                "eog_in_answer": [i for i, t in enumerate(out) if engine._rt.is_eog(t)],
            })
            print("a", json.dumps(rows[-1]), file=sys.stderr)
        threads, batch = engine.threads, engine._rt.n_batch
    finally:
        await engine.aclose()
    return rows, threads, batch


# -- part (b): the verifier ----------------------------------------------------------------------
def verify(rt: Any, prompt: list[int], answer: list[int], commit: dict[str, Any], block: int,
           variant: str, *, cached: bool, upto_block: int | None = None) -> dict[str, Any]:
    """One timed check. ``cached``: ``prompt[:-1]`` is in sequence 0 (a cache hit;
    left so afterwards), else sequence 0 is evaluated from position 0 (and left
    empty). ``upto_block``: check that block only (a sampled block), evaluating
    up to its end."""
    import llama_cpp as ll
    from p2pinfer.core.verify import VerifyConfig, judge
    from p2pinfer.engines.base import GenerationParams
    from p2pinfer.engines.llama_score import _row_score

    P, n = len(prompt), len(answer)
    blocks = blocks_of(n, block)
    chosen = range(len(blocks)) if upto_block is None else [upto_block]
    last = blocks[chosen[-1]][1] - 1  # the last answer token whose row is read
    seq = prompt + answer[:last]  # the inputs up to the row predicting answer[last]
    pos0 = P - 1 if cached else 0
    if not cached:
        rt.clear_seq(0)
    inputs = seq[pos0:]
    off = pos0 - (P - 1)  # the row of inputs[i] predicts answer[i + off]
    rows_of = {a for b in chosen for a in range(*blocks[b])}
    ends = {blocks[b][1] - 1 for b in chosen}
    scores: dict[int, Any] = {}
    hidden: dict[int, np.ndarray] = {}
    zs: dict[int, np.ndarray] = {}
    if variant == "tokens":
        def want(i: int) -> bool:
            return (i + off) in rows_of

        def read(i: int, row: int) -> None:
            z = np.ctypeslib.as_array(ll.llama_get_logits_ith(rt.ctx, row), shape=(rt.n_vocab,))
            scores[i + off] = _row_score(z, answer[i + off], 1.0)
    elif variant == "logits":
        def want(i: int) -> bool:
            return (i + off) in ends

        def read(i: int, row: int) -> None:
            zs[i + off] = logits_row(rt, row)
    else:
        def want(i: int) -> bool:
            return (i + off) in rows_of

        def read(i: int, row: int) -> None:
            hidden[i + off] = hidden_row(rt, row)
    t0 = time.perf_counter()
    outputs = evaluate(rt, inputs, pos0, want, read, embeddings=variant == "hidden")
    if variant == "tokens":
        verdict = judge([scores[a] for a in sorted(scores)], GenerationParams(), VerifyConfig())
        ok, detail = verdict.ok, {"worst_gap": verdict.statistic}
    elif variant == "logits":
        checks = [logit_check(commit["logits"][b], zs[blocks[b][1] - 1]) for b in chosen]
        ok, detail = all(c["ok"] for c in checks), {"max_diff": max(c["max_diff"] for c in checks),
                                                    "min_topk_overlap": min(c["topk_overlap"] for c in checks)}
    else:
        checks = [hidden_check(commit["hidden"][b], np.stack([hidden[a] for a in range(*blocks[b])])) for b in chosen]
        ok, detail = all(c["ok"] for c in checks), {"min_exp_hits": min(c["exp_hits"] for c in checks),
                                                    "max_mant_err_mean": max(c["mant_err_mean"] for c in checks)}
    seconds = time.perf_counter() - t0
    if cached:
        rt.truncate_seq(0, P - 1)
    else:
        rt.clear_seq(0)
    return {"variant": variant, "cached": cached, "block": upto_block, "evaluated_tokens": len(inputs),
            "output_rows": outputs, "s": seconds, "ok": ok, **detail}


def shortcut(rt: Any, prompt: list[int], answer: list[int], commit: dict[str, Any], block: int, b: int,
             *, with_prompt: bool) -> dict[str, Any]:
    """Block b's fingerprints and token check recomputed WITHOUT the earlier answer
    blocks' KV: block b's inputs right after the prompt (``prompt[:-1]`` in
    sequence 0, left so), or alone from position 0 (sequence 0 empty, left so)."""
    from p2pinfer.core.verify import VerifyConfig, judge
    from p2pinfer.engines.base import GenerationParams
    from p2pinfer.engines.llama_score import _row_score

    P = len(prompt)
    s, e = blocks_of(len(answer), block)[b]
    inputs = (prompt + answer)[P - 1 + s : P - 1 + e]  # the inputs of the rows predicting answer[s:e]
    hidden, scores, z = [], [], None

    def read(i: int, row: int) -> None:
        nonlocal z
        hidden.append(hidden_row(rt, row))
        lz = logits_row(rt, row)
        scores.append(_row_score(lz, answer[s + i], 1.0))
        z = lz
    evaluate(rt, inputs, P - 1 if with_prompt else 0, lambda i: True, read, embeddings=True)
    if with_prompt:
        rt.truncate_seq(0, P - 1)
    else:
        rt.clear_seq(0)
    assert z is not None
    return {"block": b, "with_prompt": with_prompt, "evaluated_tokens": len(inputs),
            "hidden": hidden_check(commit["hidden"][b], np.stack(hidden)),
            "logits": logit_check(commit["logits"][b], z),
            "tokens_ok": judge(scores, GenerationParams(), VerifyConfig()).ok}


def verifier_part(rt: Any, prompt: list[int], answer: list[int], honest: dict[str, Any], liar: dict[str, Any],
                  wrong: list[int], block: int) -> dict[str, Any]:
    nb = len(blocks_of(len(answer), block))
    row: dict[str, Any] = {"prompt_tokens": len(prompt), "answer_tokens": len(answer), "blocks": nb, "checks": []}
    rt.clear_seq(0)
    alone = [shortcut(rt, prompt, answer, honest, block, b, with_prompt=False) for b in range(1, nb)]
    evaluate(rt, prompt[:-1], 0, lambda i: False, lambda i, r: None)  # the cache hit
    verify(rt, prompt, answer, honest, block, "tokens", cached=True)  # a warm-up, not recorded
    for variant in ("tokens", "logits", "hidden", "tokens", "logits", "hidden"):  # twice, interleaved
        row["checks"].append(verify(rt, prompt, answer, honest, block, variant, cached=True))
    for b in range(nb):  # a sampled block: every choice
        for variant in ("tokens", "logits"):
            row["checks"].append(verify(rt, prompt, answer, honest, block, variant, cached=True, upto_block=b))
    # Which positions must be evaluated: block b without the blocks before it.
    row["shortcuts"] = [shortcut(rt, prompt, answer, honest, block, b, with_prompt=True)
                        for b in range(1, nb)] + alone
    # A liar: random tokens, its commitments computed over them by the real model.
    row["liar_random_tokens_honest_commit"] = [
        verify(rt, prompt, wrong, liar, block, v, cached=True) for v in ("tokens", "logits", "hidden")]
    # A liar that sends random tokens with the commitments of the honest answer.
    row["liar_random_tokens_stale_commit"] = [
        verify(rt, prompt, wrong, honest, block, v, cached=True) for v in ("logits", "hidden")]
    for variant in ("tokens", "logits", "hidden"):  # cold last: it empties the sequence
        row["checks"].append(verify(rt, prompt, answer, honest, block, variant, cached=False))
    return row


def summarise(a_rows: list[dict[str, Any]], b_rows: list[dict[str, Any]], block: int, k: int) -> dict[str, Any]:
    def med(xs: list[float]) -> dict[str, float]:
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}

    s: dict[str, Any] = {
        "a_engine_score": {
            "cached_s": med([r["cached_s"] for r in a_rows]), "cold_s": med([r["cold_s"] for r in a_rows]),
            "cached_evaluated_tokens": med([r["cached_evaluated_tokens"] for r in a_rows]),
            "cold_evaluated_tokens": med([r["cold_evaluated_tokens"] for r in a_rows]),
            "all_ok": all(r["cached_ok"] and r["cold_ok"] for r in a_rows),
        }
    }
    full = [c for r in b_rows for c in r["checks"] if c["block"] is None]
    for cached, variants in ((True, ("tokens", "logits", "hidden")), (False, ("tokens", "logits", "hidden"))):
        for v in variants:
            cs = [c for c in full if c["cached"] == cached and c["variant"] == v]
            s[f"b_{v}_{'cached' if cached else 'cold'}"] = {
                "s": med([c["s"] for c in cs]), "evaluated_tokens": med([c["evaluated_tokens"] for c in cs]),
                "output_rows": med([c["output_rows"] for c in cs]), "all_ok": all(c["ok"] for c in cs)}
        for v in variants[1:]:
            ratios = []
            for r in b_rows:
                ts = [c for c in r["checks"] if c["block"] is None and c["cached"] == cached and c["variant"] == "tokens"]
                os_ = [c for c in r["checks"] if c["block"] is None and c["cached"] == cached and c["variant"] == v]
                ratios += [o["s"] / t["s"] for t, o in zip(ts, os_)]
            s[f"b_{v}_over_tokens_{'cached' if cached else 'cold'}_s"] = med(ratios)
    # A sampled block: expected work over a uniform choice, against the whole-answer check.
    sampled = []
    for r in b_rows:
        wholes = [c for c in r["checks"] if c["block"] is None and c["cached"] and c["variant"] == "tokens"]
        whole = {"evaluated_tokens": wholes[0]["evaluated_tokens"], "s": statistics.median(c["s"] for c in wholes)}
        for v in ("tokens", "logits"):
            cs = [c for c in r["checks"] if c["block"] is not None and c["variant"] == v]
            sampled.append({"variant": v, "blocks": r["blocks"],
                            "mean_evaluated_tokens": statistics.mean(c["evaluated_tokens"] for c in cs),
                            "whole_evaluated_tokens": whole["evaluated_tokens"],
                            "mean_s": statistics.mean(c["s"] for c in cs), "whole_tokens_check_s": whole["s"],
                            "all_ok": all(c["ok"] for c in cs)})
    s["b_sampled_block_cached"] = sampled
    for v in ("tokens", "logits"):
        xs = [x for x in sampled if x["variant"] == v]
        s[f"b_sampled_{v}_work_fraction"] = med([x["mean_evaluated_tokens"] / x["whole_evaluated_tokens"] for x in xs])
        s[f"b_sampled_{v}_time_fraction"] = med([x["mean_s"] / x["whole_tokens_check_s"] for x in xs])
    sh = [x for r in b_rows for x in r["shortcuts"]]
    s["shortcuts"] = {
        wp: {"n": len(xs), "hidden_pass": sum(x["hidden"]["ok"] for x in xs),
             "logits_pass": sum(x["logits"]["ok"] for x in xs), "tokens_pass": sum(x["tokens_ok"] for x in xs),
             "hidden_exp_hits": med([x["hidden"]["exp_hits"] for x in xs]) if xs else None,
             "logits_max_diff": med([x["logits"]["max_diff"] for x in xs]) if xs else None}
        for wp, xs in (("after_prompt", [x for x in sh if x["with_prompt"]]),
                       ("alone", [x for x in sh if not x["with_prompt"]]))
    }
    honest = [c for r in b_rows for c in r["checks"]]
    s["honest_logits_max_diff"] = max(c["max_diff"] for c in honest if c["variant"] == "logits")
    s["honest_logits_min_topk_overlap"] = min(c["min_topk_overlap"] for c in honest if c["variant"] == "logits")
    s["honest_hidden_min_exp_hits"] = min(c["min_exp_hits"] for c in honest if c["variant"] == "hidden")
    s["honest_hidden_max_mant_err_mean"] = max(c["max_mant_err_mean"] for c in honest if c["variant"] == "hidden")
    s["honest_tokens_worst_gap"] = max(c["worst_gap"] for c in honest if c["variant"] == "tokens")
    s["liar_honest_commit_passes"] = {
        v: sum(c["ok"] for r in b_rows for c in r["liar_random_tokens_honest_commit"] if c["variant"] == v)
        for v in ("tokens", "logits", "hidden")}
    s["liar_stale_commit_passes"] = {
        v: sum(c["ok"] for r in b_rows for c in r["liar_random_tokens_stale_commit"] if c["variant"] == v)
        for v in ("logits", "hidden")}
    s["answer_wire_bytes_per_block"] = med([r["answer_wire_bytes"] / r["blocks"] for r in b_rows])
    s["detection"] = detection(sorted({r["blocks"] for r in b_rows} | {512 // block}), block)
    s["bytes_per_block"] = {"hidden_toploc_poly": TOPLOC_BYTES_PER_BLOCK, "hidden_raw_index_bf16": TOPLOC_K * 4,
                            "logits_topk_uint16_fp16": k * 4}
    return s


def detection(blocks: list[int], block: int) -> list[dict[str, Any]]:
    """Per check of an answer of B blocks: the chance to catch a liar that corrupts a
    share f of its blocks, and the work (answer tokens evaluated, prompt cached) as a
    share of the whole-answer check. ``random``: each block corrupted with chance f;
    ``tail``: the last ceil(f B) blocks (a liar that knows a sampled check evaluates
    from the start). ``one``: block j uniform, only it checked; ``prefix``: block j
    uniform, every block up to it checked (the same tokens evaluated)."""
    import math

    out = []
    for nb in blocks:
        work = statistics.mean((j + 1) * block for j in range(nb)) / (nb * block)
        for f in (0.1, 0.25, 0.5, 1.0):
            tail = math.ceil(f * nb) / nb
            prefix = 1 - statistics.mean((1 - f) ** (j + 1) for j in range(nb))
            out.append({"blocks": nb, "f": f, "work_share": work, "whole": 1.0,
                        "one_random": f, "one_tail": tail, "prefix_random": prefix, "prefix_tail": tail,
                        "one_tail_per_work": tail / work, "prefix_random_per_work": prefix / work})
    return out


async def main(prompts: int, max_tokens: int, block: int, k: int, seed: int) -> dict[str, Any]:
    from p2pinfer.engines.llama_runtime import LlamaRuntime
    from p2pinfer.engines.model_files import default_model_path
    from p2pinfer.workloads.mmlu import MMLUWorkload, load_mmlu

    rng = random.Random(seed)
    work = MMLUWorkload(load_mmlu(), seed=seed)
    texts = ["".join(p.parts) for p in work.prompts(prompts, rng)]
    path = str(default_model_path())
    t0 = time.perf_counter()
    # flash attention off, as LlamaCppEngine has it on the CPU (llama.cpp's auto would turn it on)
    server = LlamaRuntime(path, n_ctx=4096, n_batch=128, n_gpu_layers=0, n_threads=1, flash_attn=False)
    from p2pinfer.net.proto import p2pinfer_pb2 as pb

    toks, answers, honest, liars, wrongs, serve_s, answer_bytes = [], [], [], [], [], [], []
    try:
        for text in texts:
            prompt = server.tokenize(text, add_special=True)
            t1 = time.perf_counter()
            answer, commit = serve(server, prompt, max_tokens, block, k)
            serve_s.append(time.perf_counter() - t1)
            wrong = [rng.randrange(server.n_vocab) for _ in answer]
            toks.append(prompt)
            answers.append(answer)
            honest.append(commit)
            wrongs.append(wrong)
            liars.append(commit_by_prefill(server, prompt, wrong, block, k))
            # The answer's own bytes on the wire: its tokens and text in one TokenChunk (a lower bound).
            answer_bytes.append(pb.TokenChunk(token_ids=answer, text=server.detokenize(answer)).ByteSize())
            print("served", len(prompt), len(answer), file=sys.stderr)
    finally:
        server.close()
    a_rows, threads, batch = await engine_part(toks, answers)
    verifier = LlamaRuntime(path, n_ctx=4096, n_batch=batch, n_gpu_layers=0, n_threads=threads, flash_attn=False)
    b_rows = []
    try:
        for i in range(len(toks)):
            b_rows.append(verifier_part(verifier, toks[i], answers[i], honest[i], liars[i], wrongs[i], block))
            b_rows[-1]["server_decode_with_commit_s"] = serve_s[i]
            b_rows[-1]["answer_wire_bytes"] = answer_bytes[i]
            b_rows[-1]["answer"] = answers[i]
            print("b", i, file=sys.stderr)
    finally:
        verifier.close()
    return {
        "what": "issue 21 part 4: TOPLOC-style commitments against the current check (Engine.score), "
                "llama.cpp SmolLM2-135M-Instruct Q4_1, MMLU five-shot prompts, greedy answers of max_tokens "
                "(an end of generation fed on); server runtime 1 thread, engine and verifier "
                f"{threads} threads, batch {batch}",
        "prompts": prompts, "max_tokens": max_tokens, "block": block, "topk": k, "seed": seed,
        "wall_s": time.perf_counter() - t0,
        "summary": summarise(a_rows, b_rows, block, k),
        "a_rows": a_rows, "b_rows": b_rows,
    }


if __name__ == "__main__":
    from p2pinfer.provenance import with_provenance

    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    result = trio.run(main, a.prompts, a.max_tokens, a.block, a.topk, a.seed)
    with open(a.out, "w") as f:
        json.dump(with_provenance(result, sys.argv), f, indent=2, default=float)
        f.write("\n")
    print(json.dumps(result["summary"], indent=2, default=float))
