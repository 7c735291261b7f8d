"""A third-party engine, installed as a package, is found by its entry point name."""

from __future__ import annotations

import os
from pathlib import Path
import shutil
import subprocess
import sys

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "engine_plugin"

_USE_IT = """
import trio
from p2pinfer.engines import GenerationParams, GenerationRecord, available_engines, load_engine

async def main():
    engine = load_engine("echo", cache_tokens=1000)
    assert type(engine).__module__ == "p2pinfer_echo_engine", type(engine)
    tokens = engine.tokenize("hello plugin")
    for expected_reuse in (0, len(tokens) - 1):
        text, record = "", None
        async for item in engine.generate(tokens, GenerationParams(max_tokens=5)):
            if isinstance(item, GenerationRecord):
                record = item
            else:
                text += item.text
        assert text == "hello", text
        assert record.reused_tokens == expected_reuse, record
    print(",".join(available_engines()))

trio.run(main)
"""


@pytest.mark.slow
def test_the_example_plugin_installs_and_loads_by_its_entry_point_name(tmp_path: Path) -> None:
    # Installed into a private target directory, not the shared venv, so that
    # other tests never see an extra engine.
    target = tmp_path / "site"
    source = shutil.copytree(EXAMPLE, tmp_path / "src", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert install.returncode == 0, install.stderr
    assert list(target.glob("p2pinfer_echo_engine-*.dist-info"))
    env = dict(os.environ, PYTHONPATH=str(target))
    run = subprocess.run([sys.executable, "-c", _USE_IT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().split(",") == ["echo", "llama-cpp", "simulated"]

    # and without the package, the name is unknown
    bare = subprocess.run(
        [sys.executable, "-c", "from p2pinfer.engines import load_engine; load_engine('echo')"],
        capture_output=True, text=True, timeout=300,
    )
    assert bare.returncode != 0 and "no engine named 'echo'" in bare.stderr
