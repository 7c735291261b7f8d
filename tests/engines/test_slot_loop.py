"""The slot loop never waits for whoever receives its events.

Events go out through a poster thread (:class:`p2pinfer.engines.slot_loop.Poster`):
a receiver that is slow to take them (a busy trio thread) must not hold up
llama.cpp, and they must still arrive complete and in order.
"""

from __future__ import annotations

import threading
import time

import pytest

from p2pinfer.engines.llama_runtime import LlamaRuntime, SamplerSpec
from p2pinfer.engines.model_files import default_model_path
from p2pinfer.engines.slot_events import Finished, Restored
from p2pinfer.engines.slot_loop import SlotJob, SlotLoop
from p2pinfer.engines.base import TokenChunk

pytestmark = pytest.mark.model


def test_a_blocked_receiver_does_not_stop_decoding_and_gets_every_event_in_order() -> None:
    rt = LlamaRuntime(str(default_model_path()), n_ctx=512, n_batch=64, n_gpu_layers=0, n_threads=2, n_seq=1)
    loop = SlotLoop(rt)
    loop.start()
    gate = threading.Event()
    received: list[object] = []
    done = threading.Event()

    def post(_job: SlotJob, events: list[object]) -> None:
        gate.wait()  # the receiver is stuck until the test lets it go
        received.extend(events)
        if any(isinstance(e, Finished) for e in events):
            done.set()

    max_tokens = 12
    prompt = rt.tokenize("Count slowly from one to twenty: one, two, three,", add_special=True)
    try:
        job = SlotJob(prompt, SamplerSpec(0.0, 0, 1.0, None), max_tokens, post)
        loop.submit(job)
        # The loop runs the whole generation while not one event has been taken.
        deadline = time.monotonic() + 600
        while not job.done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert job.done, "the slot loop stopped while its receiver was blocked"
        assert received == []
        steps_while_blocked = loop.steps
        assert steps_while_blocked == job.decode_steps > 0
        gate.set()
        assert done.wait(60)
    finally:
        gate.set()
        loop.close()
        rt.close()
    assert isinstance(received[0], Restored)
    assert isinstance(received[-1], Finished)
    tokens = [t for e in received if isinstance(e, TokenChunk) for t in e.token_ids]
    assert tokens == job.ids  # every token, in the order the loop produced them
    assert received[-1].generated == len(job.ids) == job.generated
