"""The node setting ``flash_attn`` (auto/on/off) reaches the llama.cpp engine, and a bad value is refused."""

from __future__ import annotations

import pytest

from p2pinfer.cli.node_cmd import engine_options
from p2pinfer.cli.settings import SettingsError, resolve_settings


def test_auto_leaves_the_engine_default_and_on_off_are_passed() -> None:
    auto, origin = resolve_settings({}, env={})
    assert auto.flash_attn == "auto" and "flash_attn" not in engine_options(auto) and origin["flash_attn"] == "default"
    on, origin = resolve_settings({"flash_attn": "on"}, env={})
    assert engine_options(on)["flash_attn"] is True and origin["flash_attn"] == "flag"
    off, origin = resolve_settings({}, env={"P2PINFER_FLASH_ATTN": "off"})
    assert engine_options(off)["flash_attn"] is False and origin["flash_attn"] == "$P2PINFER_FLASH_ATTN"


def test_a_bad_value_is_refused_with_its_name() -> None:
    bad, _ = resolve_settings({"flash_attn": "yes"}, env={})
    with pytest.raises(SettingsError, match="flash_attn must be one of auto, on, off, not 'yes'"):
        engine_options(bad)


@pytest.mark.model
def test_the_engine_runs_with_what_the_setting_says() -> None:
    """The engine is built with flash attention as asked (its describe()), and generates with it."""
    import trio

    from p2pinfer.engines.base import GenerationParams
    from p2pinfer.engines.llama_cpp import LlamaCppEngine

    for value, expected in (("on", "on"), ("auto", "off")):
        settings, _ = resolve_settings({"flash_attn": value, "slots": 1, "context_size": 256, "threads": 1}, env={})
        opts = engine_options(settings)
        opts.pop("model_path", None)
        engine = LlamaCppEngine(**opts)
        try:
            assert engine.describe()["flash_attn"] == expected

            async def one() -> list[int]:
                out: list[int] = []
                async for item in engine.generate(engine.tokenize("The capital of France is"), GenerationParams(max_tokens=4)):
                    out.extend(getattr(item, "token_ids", ()))
                return out

            assert len(trio.run(one)) == 4
        finally:
            trio.run(engine.aclose)
