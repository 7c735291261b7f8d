"""Simulated nodes with several slots: the llama.cpp engine's continuous batching on the virtual clock.

With ``SimConfig.slots > 1`` a node serves up to ``slots`` requests at
once, as the llama.cpp engine's slot loop (``engines/slot_loop.py``) does,
so that routing is simulated against the engines the swarm runs:

* **admission**: a waiting request takes a slot as soon as one is free,
  first come first served, except that one whose prefix a prompt in
  prefill (or waiting ahead of it) will cache waits for it: the engine's
  own rule, :func:`~p2pinfer.core.engine_queue.waits_for_prefix`, so that
  two slots do not compute one prefix twice. Its cached prefix is pinned
  until its prefill ends, since other slots insert meanwhile.
* **iterations**: one prompt chunk (``chunk_cuts``: 128 tokens, of the
  request admitted first among those in prefill), then one decode step with
  one token for every decoding slot, and so on. A prompt's last chunk gives
  its first token (it then decodes in the same iteration's step); a long
  prompt delays the others' next token by one chunk at most.
* **prices**: a chunk costs its tokens at the prefill speed (the first
  also the request's overhead and the restore of its cached prefix); a
  step of ``k`` sequences costs ``EngineCostModel.decode_step_ms(k)``. On
  shared cores each chunk and each step is one job of the node on
  :class:`~p2pinfer.self.cpu.SharedCpu`.
* **what the node reports** (``EngineQueue``): slots, free slots and,
  with none free, the wait for one (from each running answer's length at
  the decode speed, which starts at the calibrated single-sequence speed
  and then follows what its answers measure, per step, as a live engine
  does), besides queued prefill; so ``cost`` sends a request to a node with
  a free slot rather than behind its answers.

Not modelled: answer checks (``answer_checks.py`` models them with one slot only) and reply saves as slot work (a reply joins
the cache at the end of its answer at no cost, as with one slot), and the
decode pressure a busy node's steps put on a new prompt's chunks is in no
load report (the live engine reports none either).

A mixin of :class:`~p2pinfer.self.simulator.Simulator`; with one slot the
simulator keeps its own one-request-at-a-time path, so every earlier
figure reproduces.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.costmodel import chunk_cuts
from ..core.engine_queue import waits_for_prefix
from .cpu import SharedCpu
from .model import Job, SimConfig, SimNode

__all__ = ["SlotBatching"]


class SlotBatching:
    """The several-slot serving path of the simulator (see the module docstring)."""

    # Provided by the simulator.
    config: SimConfig
    cpu: SharedCpu | None
    now: float
    _compute: Callable[..., None]
    _first_token: Callable[[SimNode, Job], None]
    _complete: Callable[[SimNode, Job], None]
    _check_busy: Callable[[SimNode], None]

    def _admit_slots(self, node: SimNode) -> None:
        """Start waiting jobs while slots are free (the engine's ``_admit``); computes nothing."""
        engine = node.engine
        bs = node.router.hasher.block_size
        ahead = [j.req.tokens for j in node.running if j.cuts]
        for job in list(node.queue):
            if not engine.can_start():
                break
            tokens = job.req.tokens
            wait = waits_for_prefix(tokens, node.cache.match(tokens, touch=False), ahead, bs)
            ahead.append(tokens)
            if wait:
                continue
            node.queue.remove(job)
            reused = node.cache.match(tokens)
            job.pin = node.cache.pin(tokens[:reused])
            engine.start(job.ticket, reused)  # type: ignore[arg-type]
            job.reused = reused
            job.cuts = [size for _, size in chunk_cuts(max(1, len(tokens) - reused))]
            job.started = self.now
            node.running.append(job)

    def _iterate(self, node: SimNode) -> None:
        """Start the node's next iteration, unless it is computing: a prompt chunk, else a decode step."""
        if node.computing or not node.alive:
            return
        job = next((j for j in node.running if j.cuts), None)
        if job is None:
            self._step(node)
            return
        cost = self.config.cost
        size = job.cuts[0]
        ms = size * cost.prefill_ms_per_token
        if job.work_s == 0.0:  # its first chunk: the request's fixed costs
            ms += cost.request_overhead_ms + (cost.cache_hit_overhead_ms if job.reused else 0.0)
        work = ms / 1000.0
        node.computing = True
        node.busy_s += work
        job.work_s += work
        self._compute(node, work, self._chunk_done, node, job, self.now)

    def _chunk_done(self, node: SimNode, job: Job, began: float) -> None:
        if not node.alive:
            return
        node.computing = False
        job.cuts.pop(0)
        job.prefill_wall_s += self.now - began
        if not job.cuts:
            self._prefilled(node, job)
        self._step(node)

    def _prefilled(self, node: SimNode, job: Job) -> None:
        """Its last chunk is done: the first token goes out, its prompt joins the cache."""
        req = job.req
        measured = None
        if self.cpu is not None and job.work_s > 0:
            # As with one slot: on shared cores the measured speed carries the contention.
            measured = self.config.cost.prefill_ms_per_token * job.prefill_wall_s / job.work_s
        node.engine.prefilled(job.ticket, len(req.tokens) - job.reused, measured, now=self.now)  # type: ignore[arg-type]
        if job.pin is not None:
            node.cache.unpin(job.pin)
            job.pin = None
        node.cache.insert(req.tokens)
        node.router.end_serving(job.in_service)
        self._first_token(node, job)
        job.generated = 1
        if job.generated >= req.output_tokens:
            self._leave_slot(node, job)
        self._admit_slots(node)  # requests waiting for this prefix may go now
        self._check_busy(node)

    def _step(self, node: SimNode) -> None:
        """One decode step for every decoding slot; with none, the next chunk (if any)."""
        decoding = [j for j in node.running if not j.cuts]
        if not decoding:
            if any(j.cuts for j in node.running):
                self._iterate(node)
            return
        work = self.config.cost.decode_step_ms(len(decoding)) / 1000.0
        node.computing = True
        node.busy_s += work
        self._compute(node, work, self._step_done, node, decoding, self.now)

    def _step_done(self, node: SimNode, decoding: list[Job], began: float) -> None:
        if not node.alive:
            return
        node.computing = False
        dt = self.now - began
        for job in decoding:
            job.generated += 1
            job.decode_steps += 1
            job.decode_s += dt
            if job.generated >= job.req.output_tokens:
                self._leave_slot(node, job)
        self._admit_slots(node)
        self._iterate(node)
        self._check_busy(node)

    def _leave_slot(self, node: SimNode, job: Job) -> None:
        """Its answer is complete: its slot frees, the request completes."""
        if job.decode_steps >= 2:  # as the live engine measures its decode speed
            node.engine.decode_measured(job.decode_s * 1000.0 / job.decode_steps)
        node.engine.finish(job.ticket)  # type: ignore[arg-type]
        node.running.remove(job)
        self._complete(node, job)
