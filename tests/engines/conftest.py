"""One real llama.cpp engine per test module: loading it takes about 0.4 s, and
every test empties its cache first so that tests do not depend on each other."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio


def _close(engine: object) -> None:
    trio.run(engine.aclose)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def llama_engine() -> Iterator[object]:
    from p2pinfer.engines.llama_cpp import LlamaCppEngine

    # These tests state what the prefix cache holds of *prompts*; replies joining it
    # (on by default) are tested in test_reply_cache.py.
    engine = LlamaCppEngine(context_size=4096, reply_cache=False)
    try:
        yield engine
    finally:
        _close(engine)


@pytest.fixture
def engine(llama_engine: object) -> object:
    llama_engine.cache.clear()  # type: ignore[attr-defined]
    return llama_engine
