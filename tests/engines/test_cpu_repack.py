"""CPU weight repacking is off unless asked for (issue 13).

llama.cpp's extra CPU buffer types (AMX, repacked AVX/NEON layouts) are on
by default upstream and crash on Intel AMX CPUs (llama.cpp issue 20824), so
every model p2pinfer loads must have ``use_extra_bufts`` off by default.
"""

from __future__ import annotations

import pytest

from p2pinfer.cli.node_cmd import engine_options
from p2pinfer.cli.settings import resolve_settings
from p2pinfer.engines.llama_runtime import model_params

pytestmark = pytest.mark.model


def test_default_model_params_disable_extra_buffer_types() -> None:
    import llama_cpp

    assert llama_cpp.llama_model_default_params().use_extra_bufts is True  # upstream's default
    assert model_params(0).use_extra_bufts is False
    assert model_params(-1).use_extra_bufts is False
    assert model_params(0, cpu_repack=True).use_extra_bufts is True


def test_the_engine_loads_without_repacking_unless_asked(engine: object) -> None:
    described = engine.describe()  # type: ignore[attr-defined]
    assert described["cpu_repack"] is False
    assert engine._rt.cpu_repack is False  # type: ignore[attr-defined]


def test_node_settings_pass_cpu_repack_only_when_asked() -> None:
    default, _ = resolve_settings({}, env={})
    assert default.cpu_repack is False
    assert "cpu_repack" not in engine_options(default)
    chosen, origin = resolve_settings({}, env={"P2PINFER_CPU_REPACK": "1"})
    assert engine_options(chosen)["cpu_repack"] is True
    assert origin["cpu_repack"] == "$P2PINFER_CPU_REPACK"


def test_the_plain_llama_baseline_loads_without_repacking_too() -> None:
    import llama_cpp

    from p2pinfer.engines.llama_runtime import plain_llama
    from p2pinfer.engines.model_files import default_model_path

    llm = plain_llama(str(default_model_path()), n_ctx=64, verbose=False)
    try:
        assert llm.model_params.use_extra_bufts is False
        assert llm.tokenize(b"Hello")  # a working model
    finally:
        llm.close()
    assert llama_cpp.llama_model_default_params().use_extra_bufts is True  # the library is left as it was
