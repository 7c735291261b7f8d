"""llama.cpp work outside the slot loop leaves no OpenMP thread pool behind.

libgomp keeps a pool of worker threads for every thread that ever ran a
llama.cpp graph; two such threads in one process (the engine's constructor
ran a probe decode on the caller's thread, then the slot loop decodes) made
libgomp count more threads than cores and cut its barrier spinning, which
slowed decode about 2x on 2 cores (docs/results.md, issue 18). The observable
trace of such a pool is an OS thread that Python's ``threading`` does not
know. Measured in a fresh child process, so that no earlier test's pools count.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.model

CHILD = r"""
import json, os, threading, trio
import llama_cpp  # its import starts a thread of its own: counted before
from p2pinfer.engines import GenerationParams
from p2pinfer.engines.llama_cpp import LlamaCppEngine

def foreign():
    return len(os.listdir("/proc/self/task")) - len(threading.enumerate())

out = {"before": foreign()}
engine = LlamaCppEngine(context_size=512, threads=2, slots=2, cache_tokens=0)
out["after_construction"] = foreign()

async def generate():
    async for _ in engine.generate(list(range(100, 140)), GenerationParams(max_tokens=4)):
        pass
    await engine.wait_reply_saves()

trio.run(generate)
out["after_one_generation"] = foreign()
trio.run(generate)
out["after_two_generations"] = foreign()
trio.run(engine.aclose)
print(json.dumps(out))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads through /proc")
def test_constructing_an_engine_leaves_no_llama_cpp_worker_threads() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, check=True)
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    # The probe decode ran on a thread that ended, taking its pool with it.
    assert counts["after_construction"] == counts["before"], counts
    # The slot loop's own pool (threads - 1 workers at most) is made once, not per generation.
    grown = counts["after_one_generation"] - counts["before"]
    assert 0 <= grown <= 1, counts
    assert counts["after_two_generations"] == counts["after_one_generation"], counts
