"""Try an engine configuration in a child process before trusting it.

llama.cpp runs native code that can crash the whole process on some
machines (the AMX weight-repacking path segfaults on some Intel CPUs,
llama.cpp issue 20824; a GPU build can meet a driver it does not support).
A crash in our own process is a dead terminal with "Segmentation fault";
the same crash in a child is a sentence: "this configuration crashes on
this CPU (signal 11, SIGSEGV)". ``p2pinfer doctor`` tries every candidate
configuration this way and ``p2pinfer node`` tries its own before it loads
the model itself (about a second).

The child (``python -m p2pinfer.engines.engine_check CONFIG_JSON``) loads
the model with the given options, generates a few greedy tokens and prints
one JSON object: what llama.cpp reported about devices and offload, the
model fingerprint, KV bytes per token and the timings.

Test hook: ``P2PINFER_TEST_ENGINE_CHECK_SIGNAL=SIGSEGV`` makes the child
raise that signal itself just before the model is loaded (only in configs
whose label is listed in ``P2PINFER_TEST_ENGINE_CHECK_LABELS``, comma
separated, when that variable is set), so tests can show that a crash is
reported and survived without needing a CPU that really crashes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

__all__ = [
    "CHECK_PROMPT",
    "EngineCheck",
    "EngineCheckResult",
    "check_engine",
    "describe_exit",
]

CHECK_PROMPT = "The capital of France is"
CHECK_TOKENS = 8
TEST_SIGNAL_ENV = "P2PINFER_TEST_ENGINE_CHECK_SIGNAL"
TEST_LABELS_ENV = "P2PINFER_TEST_ENGINE_CHECK_LABELS"
_RESULT_PREFIX = "P2PINFER_ENGINE_CHECK_RESULT "


@dataclass(frozen=True)
class EngineCheck:
    """One configuration to try: a label for people and the engine's options."""

    label: str
    options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword options of :class:`~p2pinfer.engines.llama_cpp.LlamaCppEngine`."""


@dataclass
class EngineCheckResult:
    config: str
    options: dict[str, Any]
    ok: bool
    seconds: float
    signal: str | None = None
    """The signal's name (``SIGSEGV``) when the child was killed by one."""
    exit_code: int | None = None
    error: str | None = None
    """One line a person can act on; None when ok."""
    report: dict[str, Any] = field(default_factory=dict)
    """What the child measured (devices, offload, fingerprint, timings)."""
    stderr_tail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "options": self.options,
            "ok": self.ok,
            "signal": self.signal,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "error": self.error,
            **({"report": self.report} if self.report else {}),
            **({"stderr_tail": self.stderr_tail} if self.stderr_tail and not self.ok else {}),
        }


def describe_exit(returncode: int) -> tuple[str | None, str]:
    """(signal name or None, a phrase) for a child's return code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return name, f"was killed by signal {-returncode} ({name})"
    return None, f"exited with status {returncode}"


def check_engine(check: EngineCheck, *, timeout_s: float = 120.0, env: Mapping[str, str] | None = None) -> EngineCheckResult:
    """Run ``check`` in a child process; never raises for what the child does."""
    payload = json.dumps({"label": check.label, "options": dict(check.options)})
    t0 = time.perf_counter()
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("PYTHONFAULTHANDLER", "1")  # a native crash prints the Python stack to stderr
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "p2pinfer.engines.engine_check", payload],
            capture_output=True, text=True, timeout=timeout_s, env=child_env,
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or "") if isinstance(exc.stderr, str) else ""
        return EngineCheckResult(
            check.label, dict(check.options), False, time.perf_counter() - t0,
            error=f"the {check.label} configuration did not finish a test generation of {CHECK_TOKENS} tokens within {timeout_s:.0f} s",
            stderr_tail=tail[-2000:],
        )
    seconds = time.perf_counter() - t0
    report: dict[str, Any] = {}
    for line in proc.stdout.splitlines():
        if line.startswith(_RESULT_PREFIX):
            try:
                report = json.loads(line[len(_RESULT_PREFIX):])
            except ValueError:
                report = {}
    tail = proc.stderr[-2000:]
    if proc.returncode == 0 and report.get("ok"):
        report.pop("ok", None)
        return EngineCheckResult(check.label, dict(check.options), True, seconds, exit_code=0, report=report)
    sig, phrase = describe_exit(proc.returncode)
    if sig is not None:
        error = (
            f"the {check.label} configuration crashes on this machine: the child process running a "
            f"test generation of {CHECK_TOKENS} tokens {phrase} inside llama.cpp"
        )
    elif report.get("error"):
        error = f"the {check.label} configuration failed: {report['error']}"
    else:
        error = f"the {check.label} configuration failed: the test generation {phrase}"
    report.pop("ok", None)
    report.pop("error", None)
    return EngineCheckResult(
        check.label, dict(check.options), False, seconds, signal=sig, exit_code=proc.returncode,
        error=error, report=report, stderr_tail=tail,
    )


# -- the child ---------------------------------------------------------------------------------


def _raise_test_signal(label: str) -> None:
    name = os.environ.get(TEST_SIGNAL_ENV)
    if not name:
        return
    labels = os.environ.get(TEST_LABELS_ENV)
    if labels is not None and label not in {x.strip() for x in labels.split(",")}:
        return
    os.kill(os.getpid(), getattr(signal, name))


def _child(label: str, options: dict[str, Any]) -> dict[str, Any]:
    import ctypes

    import trio

    import llama_cpp

    from .base import GenerationParams, GenerationRecord, TokenChunk
    from .llama_cpp import LlamaCppEngine
    from .llama_runtime import _init_backend

    _init_backend()
    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def capture(level: int, text: bytes, _user: Any) -> None:
        lines.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(capture, ctypes.c_void_p(0))
    _raise_test_signal(label)
    t0 = time.perf_counter()
    engine = LlamaCppEngine(**options)
    load_s = time.perf_counter() - t0
    try:
        tokens = engine.tokenize(CHECK_PROMPT)

        async def run() -> tuple[list[int], str, GenerationRecord | None]:
            out: list[int] = []
            text: list[str] = []
            record = None
            async for item in engine.generate(tokens, GenerationParams(max_tokens=CHECK_TOKENS)):
                if isinstance(item, TokenChunk):
                    out.extend(item.token_ids)
                    text.append(item.text)
                else:
                    record = item
            return out, "".join(text), record

        t1 = time.perf_counter()
        out, text, record = trio.run(run)
        gen_s = time.perf_counter() - t1
        described = engine.describe()
    finally:
        trio.run(engine.aclose)
    wanted = ("offloaded", "model buffer size", "KV buffer size", "REPACK", "using device", "AMX")
    return {
        "ok": True,
        "load_s": round(load_s, 3),
        "generate_s": round(gen_s, 3),
        "prompt": CHECK_PROMPT,
        "generated_tokens": len(out),
        "text": text,
        "ttft_ms": round(record.ttft_s * 1000, 2) if record else None,
        "engine": described,
        "llama_cpp_log": [ln.strip() for ln in lines if any(w in ln for w in wanted)][:40],
    }


def main(argv: Sequence[str]) -> int:
    spec = json.loads(argv[1])
    try:
        report = _child(spec["label"], dict(spec.get("options") or {}))
    except Exception as exc:  # a Python-level failure: report it, the parent decides
        print(_RESULT_PREFIX + json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(_RESULT_PREFIX + json.dumps(report, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
