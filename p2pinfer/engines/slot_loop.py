"""Continuous batching: the thread that owns a llama.cpp context and steps every slot.

The llama.cpp engine has ``n_slots`` sequences in one context
(:class:`~p2pinfer.engines.llama_runtime.LlamaRuntime`). One thread, the
*slot loop*, does all the work on that context, in iterations:

1. **reap**: a job whose request was cancelled leaves its slot (its KV is
   dropped, its sampler freed) before anything else runs;
2. **admit**: jobs submitted by the engine take the lowest free slots; a
   job's cached prefix (saved spans, planned by the engine) is restored into
   its slot's sequence;
3. **one prompt chunk**: of the job admitted first among those still in
   prefill or saving a reply a request waits for (first come first served,
   which minimises the average time to first token among prompts); a reply
   nobody waits for is saved only in spare time, when there is no prompt
   chunk, check or decode step to run, and given up when a request needs
   its slot (:meth:`SlotLoop._drop_reply_saves`); when it is the prompt's last chunk the
   first token is sampled and sent at once, then the prompt's new span is
   saved for the cache. An answer check (:class:`ScoreJob`) is background
   work: its chunk goes instead only when no request has one ready, or
   when it has been passed over long enough
   (:class:`~p2pinfer.core.engine_queue.CheckTurns`);
4. **one decode step**: one ``llama_decode`` with one token for every
   decoding slot, then one sample per slot.

When a generation ends and its reply is to join the cache, its last token
goes out at once with :class:`~.slot_events.SavingReply` (the engine ends
the request's stream there) and the job keeps its slot for one more phase,
*saving the reply*, as background work of the engine: the reply (and the
chat template's end of turn) is evaluated again as prompt chunks,
scheduled in step 3 (in spare time unless wanted), then its span is saved and the job
finishes (:meth:`SlotLoop._begin_reply`).

So a long prompt or reply delays the others' next token by one chunk at
most, and a slot is taken as soon as it is free. The loop never waits for a consumer:
results go out through each job's ``post`` callback (the engine hands them
to the request's trio task without blocking), so a slow reader only fills
its own buffer. Events are queued in the loop's *outbox* and handed, just
before its next llama.cpp call or before it waits for work
(:meth:`SlotLoop._flush`), to a second thread, the :class:`Poster`, which
posts them while llama.cpp runs. Posting from the loop itself cost about
0.3 ms per decode step (measured: docs/results.md, issue 18): waking trio
writes to a socket, which releases the GIL, and the woken trio thread took
it and kept it for its own work while the loop waited.

The engine side (admission, the prefix cache, queue accounting) runs in
trio and talks to the loop only through :meth:`SlotLoop.submit`, a job's
``cancel`` flag and the events a job posts. Nothing here touches the radix
tree.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
import logging
import threading
import time
from typing import Any

from ..core.engine_queue import CheckTurns
from .base import PositionScore, TokenChunk, TokenLogprob
from .kv_state import KvSpan
from .slot_events import Event, Failed, Finished, Prefilled, Restored, SavingReply
from .llama_runtime import DecodeError, GrammarError, LlamaRuntime, RestoreError, SamplerSpec
from .text_stream import TextStream

__all__ = ["ScoreJob", "SlotJob", "SlotLoop"]

log = logging.getLogger("p2pinfer.engines.slots")


@dataclass(eq=False)
class SlotJob:
    """One request as the slot loop sees it."""

    tokens: list[int]
    sampler: SamplerSpec
    max_tokens: int
    post: Callable[[SlotJob, list[Event]], None]
    """Called in the loop thread with this job's new events; must not block."""
    stop: tuple[str, ...] = ()
    restore: list[tuple[KvSpan, int, int]] = field(default_factory=list)
    """Saved spans of the cached prefix: ``(span, start, upto)``, consecutive from 0."""
    save_from: int | None = None
    """Save the prompt's positions ``[save_from, n)`` once they are evaluated."""
    reply_tail: tuple[int, ...] | None = None
    """Cache the reply when the generation ends (stop or length), followed by
    these tokens: what the next turn renders after the reply's text (the chat
    template's end of turn, measured by the engine; empty for a completion).
    None: do not cache the reply. See :meth:`SlotLoop._begin_reply`."""
    window: int | None = None
    """Longest sequence a span may be saved from (the engine's ``cache_window``)."""
    cancel: threading.Event = field(default_factory=threading.Event)
    # -- the loop's own state ------------------------------------------------
    slot: int = -1
    order: int = 0
    pos: int = 0
    """Prompt tokens in the sequence (restored or evaluated)."""
    token: int | None = None
    """Sampled and sent, to be evaluated by the next decode step."""
    generated: int = 0
    ids: list[int] = field(default_factory=list)
    """The generated token ids (end-of-generation token excluded)."""
    emitted: list[str] = field(default_factory=list)
    """The text sent for them, piece by piece (stop strings cut out)."""
    reply_new: list[int] | None = None
    """While saving the reply: the tokens evaluated again after the prompt (see :meth:`SlotLoop._begin_reply`)."""
    reply_cuts: list[tuple[int, int]] = field(default_factory=list)
    """Their chunks, ``(offset, size)``, the next one first."""
    reply_s: float = 0.0
    reply_note: str | None = None
    reply_failed: bool = False
    """Saving the reply raised (``reply_note`` says what); the request itself is unaffected."""
    reply_wanted: bool = False
    """A request waits for this reply's save (set by the engine's thread): it is then
    scheduled like a prompt instead of in spare time, and never dropped."""
    drop_reply: bool = False
    """A request needs this slot (set by the engine's thread): give the save up, unless
    :attr:`reply_wanted` (see :meth:`SlotLoop._drop_reply_saves`)."""
    chain: Any = None
    text: TextStream | None = None
    prefill_s: float = 0.0
    first_chunk_at: float | None = None
    decode_steps: int = 0
    decode_s: float = 0.0
    done: bool = False
    reason: str = ""

    @property
    def in_prefill(self) -> bool:
        return self.pos < len(self.tokens)

    @property
    def saving_reply(self) -> bool:
        return self.reply_new is not None


@dataclass(eq=False)
class ScoreJob:
    """An answer check as the slot loop sees it: score ``tokens[start:]`` (``Engine.score``).

    It takes a free slot like a request (in submission order), gets the
    cached prefix of its prompt (``restore``, planned by the engine, at most
    ``start - 1`` tokens: the row before the answer must be computed) put
    back into its sequence, then evaluates the rest one chunk per loop
    iteration (:func:`~.llama_score.score_chunk`, with the runtime's cuts),
    as background work: requests' chunks go first (see the module
    docstring), and the decoding slots step every iteration meanwhile.
    ``restored(job)`` is called once it holds its slot (the cache's spans are
    then free again); ``done(job, error)`` once it ended, with ``scores``
    filled or ``error`` set (cancelled: ``JobCancelled``). Both run in the
    loop thread and must not block. Its sequence is emptied before and after.

    With ``save_from`` set, the prompt (``tokens[:start]``) is cut as a
    request's prompt with the same cached prefix is, the answer after it,
    and once the prompt's last position is evaluated its span from
    ``save_from`` is saved (``prompt_span``) for the engine to cache: a check
    then leaves its prompt cached as serving it would (issue 21).
    """

    tokens: list[int]
    start: int
    temperature: float
    done: Callable[[ScoreJob, BaseException | None], None]
    restored: Callable[[ScoreJob], None] | None = None
    restore: list[tuple[KvSpan, int, int]] = field(default_factory=list)
    """Saved spans of the cached prefix: ``(span, start, upto)``, consecutive from 0."""
    cancel: threading.Event = field(default_factory=threading.Event)
    order: int = 0
    save_from: int | None = None
    """Save the prompt's span from here (None: cache nothing)."""
    # -- the loop's own state ------------------------------------------------
    slot: int = -1
    prompt_span: KvSpan | None = None
    save_error: str | None = None
    reused: int = 0
    """Prompt tokens restored from the cache (not evaluated)."""
    restore_error: str | None = None
    cuts: list[tuple[int, int]] = field(default_factory=list)
    """The chunks still to evaluate, ``(offset, size)``, the next one first."""
    scores: list[PositionScore] = field(default_factory=list)
    prefill_s: float = 0.0
    """Time spent evaluating its chunks (their ``llama_decode`` and scoring)."""
    chunks: int = 0

    @property
    def prefilled(self) -> int:
        """Tokens it evaluated itself: all but the restored ones."""
        return len(self.tokens) - self.reused


class Poster:
    """The thread that calls jobs' ``post`` callbacks for the slot loop, in order.

    It exists so that the slot loop never releases the GIL itself between two
    llama.cpp calls (see the module docstring): handing a batch over is a list
    append and a notify.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queue: deque[tuple[SlotJob, list[Event]]] = deque()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="p2pinfer-slot-poster", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def hand(self, batch: list[tuple[SlotJob, list[Event]]]) -> None:
        with self._cv:
            self._queue.extend(batch)
            self._cv.notify()

    def close(self) -> None:
        """Post what is queued, then stop (blocking)."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                batch = list(self._queue)
                self._queue.clear()
            for job, events in batch:
                try:
                    job.post(job, events)
                except Exception:  # a post must not kill the poster
                    log.exception("posting a job's events failed")


class SlotLoop:
    """See the module docstring. ``start()`` before use, ``close()`` to stop."""

    def __init__(self, rt: LlamaRuntime) -> None:
        self._rt = rt
        self._cv = threading.Condition()
        self._inbox: deque[SlotJob | ScoreJob] = deque()
        self._slots: list[SlotJob | ScoreJob | None] = [None] * rt.n_seq
        self._turns = CheckTurns()
        self._closing = False
        self._order = 0
        self._outbox: list[tuple[SlotJob, list[Event]]] = []
        """Events not yet handed to the poster, in order (see :meth:`_flush`)."""
        self._poster = Poster()
        self._thread = threading.Thread(target=self._run, name="p2pinfer-slot-loop", daemon=True)
        # Observability, written by the loop thread only (plain attributes: a
        # reader in another thread sees the last value written).
        self.decoding = 0
        """Slots in their decode phase after the last iteration."""
        self.busy_slots = 0
        self.last_step_s: float | None = None
        """Wall time of the last decode step."""
        self.last_step_size = 0
        self.steps = 0
        self.chunks = 0
        self.reply_chunks = 0
        """Chunks of replies evaluated again for the cache (not in ``chunks``)."""
        self.saving_replies = 0
        """Slots saving their reply after the last iteration."""
        self.checking = 0
        """Slots running an answer check after the last iteration."""
        self.check_chunks = 0
        """Chunks of answer checks evaluated (not in ``chunks``)."""
        self.error: BaseException | None = None
        """Set if the loop itself died (a bug): every job then fails."""

    @property
    def n_slots(self) -> int:
        return len(self._slots)

    @property
    def failure(self) -> str | None:
        """Why every job fails from now on, once the loop itself has died (None while it runs)."""
        return None if self.error is None else f"the engine failed: {self.error!r}"

    def start(self) -> None:
        self._poster.start()
        self._thread.start()

    def submit(self, job: SlotJob | ScoreJob) -> None:
        """Queue ``job``; it takes the next free slot at the next iteration."""
        with self._cv:
            if self._closing:
                raise RuntimeError("the slot loop is closed")
            self._order += 1
            job.order = self._order
            self._inbox.append(job)
            self._cv.notify()

    def wake(self) -> None:
        """Make the loop look at cancel flags now (it may be waiting for work)."""
        with self._cv:
            self._cv.notify()

    def close(self) -> None:
        """Stop the loop (blocking: up to one chunk or step); running jobs fail."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            if self._thread.is_alive():
                self._thread.join()
            self._poster.close()  # after the loop's last events are handed over

    # -- the loop ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._iteration():
                pass
        except BaseException as exc:  # a bug: fail everyone rather than hang them
            log.exception("the slot loop died")
            self.error = exc
        finally:
            with self._cv:
                self._closing = True
                pending = list(self._inbox)
                self._inbox.clear()
            why = self.failure or "the engine is closed"
            for job in [j for j in self._slots if j is not None] + pending:
                if isinstance(job, ScoreJob):
                    self._end_score(job, RuntimeError(why))
                    continue
                self._end(job, Failed(why))
            self._flush()

    def _post(self, job: SlotJob, events: list[Event]) -> None:
        """Queue ``job``'s events for the next :meth:`_flush`."""
        self._outbox.append((job, events))

    def _flush(self) -> None:
        """Hand the queued events to the poster. Called right before llama.cpp work
        (which releases the GIL: an iteration's chunk, its decode step, a prompt's span
        save after its first token) and before the loop waits, so that the poster, and
        the trio thread it wakes, run beside llama.cpp rather than between its calls."""
        if self._outbox:
            out, self._outbox = self._outbox, []
            self._poster.hand(out)

    def _iteration(self) -> bool:
        with self._cv:
            while not self._closing and not self._inbox and not any(self._slots):
                self._flush()  # before waiting: nothing else would send them
                self._cv.wait()
            if self._closing:
                return False
        self._reap()
        self._drop_reply_saves()
        self._admit()
        jobs = [j for j in self._slots if isinstance(j, SlotJob)]
        checks = [j for j in self._slots if isinstance(j, ScoreJob)]
        job = min((j for j in jobs if j.in_prefill or (j.saving_reply and j.reply_wanted)), key=lambda j: j.order,
                  default=None)
        if job is None and not checks and not any(j.token is not None for j in jobs):
            # Spare time: nothing to prefill, check or decode. A reply nobody waits for is saved
            # only now, so that under load its save costs the others nothing (issue 18).
            job = min((j for j in jobs if j.saving_reply), key=lambda j: j.order, default=None)
        turn = self._turns.next(job is not None, bool(checks))
        self._flush()  # what reap and admit queued, before this iteration's llama.cpp calls
        if turn == "check":
            self._score_chunk(min(checks, key=lambda j: j.order))
        elif job is not None:
            if job.in_prefill:
                self._prefill_chunk(job)
            else:
                self._reply_chunk(job)
        if turn is not None:
            self._reap()
        steps = [j for j in self._slots if isinstance(j, SlotJob) and j.token is not None]
        if steps:
            self._flush()
            self._decode_step(steps)
        jobs = [j for j in self._slots if isinstance(j, SlotJob)]
        self.busy_slots = sum(1 for j in self._slots if j is not None)
        self.checking = self.busy_slots - len(jobs)
        self.saving_replies = sum(1 for j in jobs if j.saving_reply)
        self.decoding = sum(1 for j in jobs if not j.in_prefill and not j.saving_reply)
        return True

    def _reap(self) -> None:
        from .llama_runtime import JobCancelled  # noqa: PLC0415

        for job in self._slots:
            if job is None or not job.cancel.is_set():
                continue
            if isinstance(job, ScoreJob):
                self._end_score(job, JobCancelled())
            else:
                self._end(job, Finished("cancelled", job.generated, job.decode_steps, job.decode_s))

    def _admit(self) -> None:
        rt = self._rt
        while True:
            free = next((i for i, j in enumerate(self._slots) if j is None), None)
            if free is None:
                return
            with self._cv:
                if not self._inbox:
                    return
                job = self._inbox.popleft()
            if isinstance(job, ScoreJob):
                self._admit_score(job, free)
                continue
            if job.cancel.is_set():
                self._end(job, Finished("cancelled", 0, 0, 0.0))
                continue
            job.slot = free
            self._slots[free] = job
            rt.clear_seq(free)
            t0 = time.perf_counter()
            error = None
            if job.restore:
                try:
                    job.pos = rt.restore(job.restore, seq=free)
                except RestoreError as exc:
                    error = str(exc)
                    rt.clear_seq(free)
                    job.pos = 0
            job.restore = []  # the spans' memory belongs to the cache again
            if job.save_from is not None:
                job.save_from = min(job.save_from, job.pos)
            try:
                job.chain = rt.new_sampler(job.sampler)
            except GrammarError as exc:  # the engine checks grammars before queueing; never take the loop down
                self._end(job, Failed(f"grammar: {exc}"))
                continue
            job.text = TextStream(job.stop)
            self._post(job, [Restored(free, job.pos, time.perf_counter() - t0, error)])

    def _admit_score(self, job: ScoreJob, slot: int) -> None:
        """A check takes ``slot``: its cached prefix is put back, its chunks are cut."""
        from .llama_runtime import JobCancelled  # noqa: PLC0415

        if job.cancel.is_set():
            self._end_score(job, JobCancelled())
            return
        rt = self._rt
        job.slot = slot
        self._slots[slot] = job
        rt.clear_seq(slot)
        if job.restore:
            try:
                job.reused = rt.restore(job.restore, seq=slot)
            except RestoreError as exc:
                job.restore_error = str(exc)
                rt.clear_seq(slot)
                job.reused = 0
        job.restore = []  # the spans' memory belongs to the cache again
        job.cuts = self._score_cuts(job)
        if job.restored is not None:
            try:
                job.restored(job)
            except Exception:
                log.exception("telling that a check took its slot failed")

    def _score_cuts(self, job: ScoreJob) -> list[tuple[int, int]]:
        """A check's chunks: the same cuts as a prompt's prefill from the restored
        position; when its prompt is to be saved, the prompt's own (a request's for
        that prompt) and then the answer's, never a one-token batch."""
        rt, n, start, reused = self._rt, len(job.tokens), job.start, job.reused
        if job.save_from is None or reused >= start:
            job.save_from = None
            return [(reused + off, size) for off, size in rt.chunks(n - reused)]
        job.save_from = min(job.save_from, reused)
        prompt = [(reused + off, size) for off, size in rt.chunks(start - reused)]
        answer = [(start + off, size) for off, size in rt.chunks(n - start)]
        if answer == [(start, 1)]:  # one answer token: it goes with the prompt's last chunk
            off, size = prompt[-1]
            if size + 1 <= rt.n_batch:
                return prompt[:-1] + [(off, size + 1)]
            return prompt[:-1] + [(off, size - 1), (start - 1, 2)]
        return prompt + answer

    def _score_chunk(self, job: ScoreJob) -> None:
        """One chunk of a check; after the last, it ends with its scores."""
        from .llama_score import score_chunk  # noqa: PLC0415

        off, size = job.cuts.pop(0)
        t0 = time.perf_counter()
        try:
            job.scores += score_chunk(self._rt, job.tokens, job.start, job.temperature, off, size, seq=job.slot)
        except Exception as exc:  # handed to the caller, never kills the loop
            self._end_score(job, exc)
            return
        finally:
            job.prefill_s += time.perf_counter() - t0
        job.chunks += 1
        self.check_chunks += 1
        if job.save_from is not None and job.prompt_span is None and off + size >= job.start:
            try:
                job.prompt_span = self._rt.save_span(job.save_from, job.start, seq=job.slot)
            except Exception as exc:  # not caching this prompt is not worth failing the check
                job.save_error = str(exc)
            job.save_from = None
        if not job.cuts:
            self._end_score(job, None)

    def _end_score(self, job: ScoreJob, error: BaseException | None) -> None:
        """The check leaves its slot (its sequence emptied) and is handed back."""
        self._free_slot(job)
        try:
            job.done(job, error)
        except Exception:
            log.exception("handing a check's result back failed")

    def _prefill_chunk(self, job: SlotJob) -> None:
        rt = self._rt
        n = len(job.tokens)
        # the same cuts as LlamaRuntime.prefill over the rest of the prompt
        off, size = rt.chunks(n - job.pos)[0]
        t0 = time.perf_counter()
        if job.first_chunk_at is None:
            job.first_chunk_at = t0
        try:
            index = rt.eval_chunk(job.tokens[job.pos : job.pos + size], job.pos, job.slot)
        except DecodeError as exc:
            self._end(job, Failed(f"llama.cpp failed during prefill: {exc}"))
            return
        job.pos += size
        self.chunks += 1
        if job.in_prefill:
            job.prefill_s += time.perf_counter() - t0
            return
        first = rt.sample(job.chain, index)
        logprob = rt.token_logprob(job.sampler, index, first)
        t1 = time.perf_counter()
        job.prefill_s += t1 - t0
        wall = t1 - job.first_chunk_at
        events: list[Event] = []
        self._take(job, first, events, logprob)
        self._post(job, events)
        self._flush()  # the first token goes out before the span is saved
        span = None
        error = None
        if job.save_from is not None and job.save_from < n:
            try:
                span = rt.save_span(job.save_from, n, seq=job.slot)
            except Exception as exc:  # not caching this prompt is not worth failing the request
                error = str(exc)
        after: list[Event] = [Prefilled(job.prefill_s, wall, span, error)]
        if job.done:
            self._ended(job, after)
        self._post(job, after)

    def _decode_step(self, steps: Sequence[SlotJob]) -> None:
        rt = self._rt
        n = len(steps)
        t0 = time.perf_counter()
        try:
            rt.decode([(j.slot, j.token, len(j.tokens) + j.generated - 1) for j in steps])  # type: ignore[misc]
        except DecodeError as exc:
            for job in steps:
                self._end(job, Failed(f"llama.cpp failed while decoding: {exc}"))
            return
        picked = [rt.sample(job.chain, i) for i, job in enumerate(steps)]
        # Read now: the next decode overwrites the logits rows.
        logprobs = [rt.token_logprob(job.sampler, i, t) for i, (job, t) in enumerate(zip(steps, picked))]
        dt = time.perf_counter() - t0
        self.steps += 1
        self.last_step_s = dt
        self.last_step_size = n
        for job, token, logprob in zip(steps, picked, logprobs):
            job.decode_steps += 1
            job.decode_s += dt
            events: list[Event] = []
            self._take(job, token, events, logprob)
            if job.done:
                self._ended(job, events)
            self._post(job, events)

    def _take(self, job: SlotJob, token: int, events: list[Event], logprob: TokenLogprob | None = None) -> None:
        """Handle a sampled token: send it, or finish (end of generation, stop string, length)."""
        rt = self._rt
        assert job.text is not None
        job.token = None
        if rt.is_eog(token):
            job.done, job.reason = True, "stop"
            return
        job.generated += 1
        job.ids.append(token)
        piece = job.text.feed(rt.piece(token))
        if job.text.stopped:
            job.done, job.reason = True, "stop"
        elif job.generated >= job.max_tokens:
            piece += job.text.flush()
            job.done, job.reason = True, "length"
        else:
            job.token = token
        job.emitted.append(piece)
        events.append(TokenChunk((token,), piece, (logprob,) if logprob is not None else ()))

    def _ended(self, job: SlotJob, events: list[Event]) -> None:
        """The generation ended (``job.done``): save its reply, or finish now."""
        if self._begin_reply(job):
            events.append(SavingReply(job.reason or "stop", job.generated, job.decode_steps, job.decode_s,
                                      tuple(job.reply_new or ())))
            return
        events.append(self._finish_event(job))
        self._release(job)

    def _finish_event(self, job: SlotJob, span: KvSpan | None = None) -> Finished:
        reason = job.reason or "stop"
        return Finished(reason, job.generated, job.decode_steps, job.decode_s,
                        span, tuple(job.reply_new or ()) if span is not None else (), job.reply_s, job.reply_note,
                        job.reply_failed)

    def _begin_reply(self, job: SlotJob) -> bool:
        """Start saving the reply's KV as the next turn will render it; False: nothing to save.

        The next turn's prompt holds the reply's *text*, re-tokenised, then
        the template's end of turn (``job.reply_tail``). So the generated
        ids are kept only as far as the re-tokenised text agrees with them
        (all of them for SmolLM2, measured: docs/results.md), and the tail
        only when the whole reply agrees and no stop string cut it. The
        decode steps' KV is not what a cold prefill computes (one-token
        batches take other kernels: measured, tests/engines/test_reply_cache.py),
        so the sequence is cut back to the prompt and the reply and the tail
        are evaluated again as prompt chunks, with the cuts a prompt of
        theirs would get, one chunk per loop iteration
        (:meth:`_reply_chunk`): then these positions hold exactly what a
        cold prefill of the next turn computes (tested), and the other
        slots keep decoding meanwhile. The job holds its slot until the span
        is saved; the engine counts the tokens as queued prefill.
        """
        if job.reply_tail is None:
            return False
        t0 = time.perf_counter()
        try:
            new, job.reply_note = self._reply_tokens(job)
            if new is not None:
                self._rt.truncate_seq(job.slot, len(job.tokens))
                job.reply_cuts = self._rt.chunks(len(new))
                job.reply_new = new
        except Exception as exc:  # not caching a reply is never worth failing the request
            job.reply_new, job.reply_note = None, f"saving the reply's KV failed: {exc}"
            job.reply_failed = True
        job.reply_s += time.perf_counter() - t0
        return job.reply_new is not None

    def _reply_tokens(self, job: SlotJob) -> tuple[list[int] | None, str | None]:
        """What :meth:`_begin_reply` evaluates again after the prompt, or None, with a note."""
        rt = self._rt
        assert job.reply_tail is not None and job.text is not None
        if job.reason not in ("stop", "length"):
            return None, None
        n = len(job.tokens)
        ids = job.ids
        retok = rt.tokenize("".join(job.emitted), add_special=False)
        keep = 0
        for a, b in zip(ids, retok):
            if a != b:
                break
            keep += 1
        note = None
        if keep < len(ids):
            note = f"the reply's text re-tokenises differently after {keep} of {len(ids)} tokens"
        whole = keep == len(ids) and not job.text.stopped
        new = list(ids[:keep]) + (list(job.reply_tail) if whole else [])
        new = new[: max(0, rt.n_ctx - n)]
        end = n + len(new)
        if job.window is not None and end > job.window:
            return None, f"prompt + reply ({end} tokens) is longer than the cache window ({job.window})"
        if len(new) < 2:  # a one-token batch computes other bits than a cold prefill
            return None, note or "fewer than two reply tokens"
        return new, note

    def _reply_chunk(self, job: SlotJob) -> None:
        """One chunk of the reply being saved; after the last, save the span and finish."""
        rt = self._rt
        assert job.reply_new is not None
        n = len(job.tokens)
        off, size = job.reply_cuts.pop(0)
        t0 = time.perf_counter()
        span = None
        try:
            rt.eval_chunk(job.reply_new[off : off + size], n + off, job.slot)
            self.reply_chunks += 1
            if job.reply_cuts:
                job.reply_s += time.perf_counter() - t0
                return
            span = rt.save_span(n, n + len(job.reply_new), seq=job.slot)
        except Exception as exc:  # not caching a reply is never worth failing the request
            job.reply_note = f"saving the reply's KV failed: {exc}"
            job.reply_failed = True
        job.reply_s += time.perf_counter() - t0
        event = self._finish_event(job, span)
        self._release(job)
        self._post(job, [event])

    def _drop_reply_saves(self) -> None:
        """End the reply saves the engine asked to drop (``drop_reply``: a request needs
        the slot) unless a request has come to want them since. That reply is not
        cached: a next turn evaluates it as part of its prompt, the same work the save
        would have done."""
        for job in self._slots:
            if isinstance(job, SlotJob) and job.saving_reply and job.drop_reply and not job.reply_wanted:
                job.reply_note = "not cached: a request needed its slot before the save ran"
                self._end(job, replace(self._finish_event(job), reply_dropped=True))

    def _free_slot(self, job: SlotJob | ScoreJob) -> None:
        """Empty the job's slot and its sequence, if it still holds one."""
        if job.slot >= 0 and self._slots[job.slot] is job:
            self._slots[job.slot] = None
            try:
                self._rt.clear_seq(job.slot)
            except Exception:  # the context is being torn down
                pass

    def _release(self, job: SlotJob) -> None:
        """Free the job's slot (KV and sampler); no event."""
        job.done = True
        job.token = None
        self._free_slot(job)
        if job.chain is not None:
            self._rt.free_sampler(job.chain)
            job.chain = None

    def _end(self, job: SlotJob, event: Event) -> None:
        self._release(job)
        self._post(job, [event])
