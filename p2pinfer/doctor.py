"""``p2pinfer doctor``: what this machine, build and model are, and whether the engine runs here.

One report for a user or a bug report: Python and package versions, the
CPU and its features, llama.cpp's build (``llama_print_system_info``:
AVX/AVX2/AVX-512/AMX, BLAS, CUDA/Metal/Vulkan) and devices, where the
model's layers would go, the default model file and its fingerprint, the
cache budget in tokens and bytes, and the libp2p side as the node's settings
make it (version, transports, relay client and service, DCUtR hole
punching, the discovery mode, mDNS). Then it *tries* the engine: a short greedy generation in a
child process per candidate configuration
(:mod:`p2pinfer.engines.engine_check`), so that a configuration that crashes
on this machine is reported as such instead of taking the terminal down.

Nothing here loads a model in this process: only the children do.
"""

from __future__ import annotations

from collections.abc import Mapping
import ctypes
import importlib.metadata
import os
from pathlib import Path
import platform
import re
import sys
from typing import Any

from ._version import __version__
from .engines.engine_check import EngineCheck, EngineCheckResult, check_engine

__all__ = ["CPU_FEATURES", "collect_report", "cpu_info", "engine_checks_for", "libp2p_info", "llama_cpp_info", "transports_for"]

CPU_FEATURES = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16", "neon", "asimd", "sve", "sve2", "i8mm", "dotprod",
)
"""The CPU flags that decide which llama.cpp kernels run (and which can crash)."""

_AMX = ("amx_tile", "amx_int8", "amx_bf16")


def cpu_info() -> dict[str, Any]:
    """Model name, core count and the :data:`CPU_FEATURES` this CPU has."""
    model = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and value.strip():
            model = value.strip()
        elif key in ("flags", "features"):
            flags.update(value.split())
    if sys.platform == "darwin":
        model = _sysctl("machdep.cpu.brand_string") or model
        if platform.machine() == "arm64":
            flags.update({"neon", "asimd", "dotprod"})
    return {
        "model": model,
        "machine": platform.machine(),
        "logical_cores": os.cpu_count(),
        "features": [f for f in CPU_FEATURES if f in flags],
        "amx": any(f in flags for f in _AMX),
    }


def _sysctl(name: str) -> str | None:
    import subprocess

    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


_DEV_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}


def _ggml_devices(lib_dir: Path) -> list[dict[str, Any]]:
    """ggml's backend devices (CPU, CUDA0, Metal, Vulkan0...) with their memory."""
    devices: list[dict[str, Any]] = []
    try:
        ggml = ctypes.CDLL(str(next(iter(sorted(lib_dir.glob("libggml.*")))))) if lib_dir.is_dir() else None
    except (OSError, StopIteration):
        ggml = None
    if ggml is None:
        return devices
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(ggml, fn).restype = ctypes.c_char_p
        getattr(ggml, fn).argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    for i in range(int(ggml.ggml_backend_dev_count())):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        devices.append(
            {
                "name": (ggml.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
                "description": (ggml.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                "type": _DEV_TYPES.get(int(ggml.ggml_backend_dev_type(dev)), "other"),
                "memory_free_mib": round(free.value / (1 << 20)),
                "memory_total_mib": round(total.value / (1 << 20)),
            }
        )
    return devices


def llama_cpp_info() -> dict[str, Any]:
    """llama-cpp-python's version, llama.cpp's build flags and devices; no model is loaded."""
    try:
        import llama_cpp
    except Exception as exc:  # not installed, or its shared library does not load here
        return {"installed": False, "error": f"{type(exc).__name__}: {exc}", "system_info": None,
                "gpu_offload": False,
                "hint": "pip install 'p2pinfer[llama]' (see the README's Hardware section for GPU builds)"}
    from .engines.llama_runtime import _init_backend

    _init_backend()
    system_info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    devices = _ggml_devices(lib_dir)
    backends = sorted({m.group(1) for m in re.finditer(r"(\w+) : ", system_info)} | {d["name"].rstrip("0123456789") for d in devices})
    return {
        "installed": True,
        "llama_cpp_python": getattr(llama_cpp, "__version__", _version_of("llama-cpp-python")),
        "system_info": system_info,
        "backends": backends,
        "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
        "max_devices": int(llama_cpp.llama_max_devices()),
        "devices": devices,
    }


def _model_info(model: str | None) -> dict[str, Any]:
    from .engines.model_files import ModelFileError, file_identity, resolve_model_path

    try:
        path = resolve_model_path(model)
    except ModelFileError as exc:
        return {"ok": False, "error": str(exc)}
    return {
        "ok": True,
        "path": str(path),
        "default": not model,
        "size_mib": round(path.stat().st_size / (1 << 20), 1),
        "file_identity": file_identity(path),
    }


def transports_for(listen: Any) -> list[str]:
    """The libp2p transports a node with these listen addresses runs.

    py-libp2p's ``new_host`` builds one transport per kind of listen address
    (``_build_transports_for_swarm``: ``/tcp`` -> TCP, ``/ws``/``/wss`` ->
    WebSocket, ``/quic-v1`` -> QUIC, ...); the same rule here, without building
    them. Every node also runs circuit relay v2's transport (``p2p-circuit``):
    it accepts relayed connections and dials through relays (:mod:`p2pinfer.node.nat`).
    """
    kinds: list[str] = []
    for addr in listen:
        parts = [p.split("-")[0] if p.startswith("quic") else p for p in str(addr).split("/")]
        if "webtransport" in parts:
            kind = "webtransport"
        elif "quic" in parts:
            kind = "quic"
        elif "ws" in parts or "wss" in parts:
            kind = "websocket"
        elif "webrtc-direct" in parts:
            kind = "webrtc-direct"
        elif "tcp" in parts:
            kind = "tcp"
        else:
            kind = f"unknown ({addr})"
        if kind not in kinds:
            kinds.append(kind)
    return kinds + ["p2p-circuit"]


def libp2p_info(settings: Any) -> dict[str, Any]:
    """The network stack the node would run with ``settings``: transports, relay, hole punching, discovery."""
    auto = settings.discovery == "auto"
    return {
        "version": _version_of("libp2p"),
        "transports": transports_for(settings.listen),
        "security": ["noise"],
        "muxers": ["yamux"],
        "listen": list(settings.listen),
        "announce": list(settings.announce),
        "reachability": settings.reachability,
        "relay": {
            # The client side: reservations only while reachability says we are not public.
            "client": settings.relay_reservations > 0,
            "reservations": settings.relay_reservations,
            "static_relays": list(settings.relays),
            # The hop side: auto = while publicly reachable.
            "service": settings.relay_service,
        },
        "hole_punching": {"dcutr": bool(settings.hole_punching)},
        "discovery": {
            "mode": settings.discovery,
            "digest_gossip": settings.discovery in ("gossip", "auto"),
            "prefix_directory": settings.discovery in ("directory", "auto"),  # over py-libp2p's KadDHT
            "auto_directory_nodes": settings.auto_directory_nodes if auto else None,
            "bootstrap": len(settings.bootstrap),
            "mdns": bool(settings.mdns),
            "gossip_peer_exchange": True,
        },
        "private_network": bool(settings.private_network),
    }


def engine_checks_for(settings: Any) -> list[EngineCheck]:
    """The default configuration, and with CPU repacking when the user asked for it."""
    from .cli.node_cmd import engine_options

    options = engine_options(settings)
    options.pop("cpu_repack", None)
    checks = [EngineCheck("default", options)]
    if settings.cpu_repack:
        checks.append(EngineCheck("cpu-repack", {**options, "cpu_repack": True}))
    return checks


def _layer_plan(llama: Mapping[str, Any], check: EngineCheckResult | None, gpu_layers: int | None) -> dict[str, Any]:
    """Which device the layers go to: what llama.cpp itself logged in the check when it ran."""
    gpus = [d for d in llama.get("devices", []) if d["type"] in ("GPU", "IGPU")]
    plan: dict[str, Any] = {
        "requested_gpu_layers": "all" if gpu_layers is None and llama.get("gpu_offload") else (gpu_layers or 0),
        "gpu_devices": [d["name"] for d in gpus],
    }
    layers = None
    if check is not None and check.report:
        eng = check.report.get("engine", {})
        layers = eng.get("model_layers")
        plan["model_layers"] = layers
        plan["n_gpu_layers"] = eng.get("n_gpu_layers")
        log = check.report.get("llama_cpp_log", [])
        plan["llama_cpp_says"] = [ln for ln in log if "offloaded" in ln or "model buffer size" in ln]
    what = f"{layers} layers" if layers else "every layer"
    if not llama.get("gpu_offload"):
        plan["summary"] = f"{what} on the CPU (this llama.cpp build has no GPU offload)"
    elif not gpus:
        plan["summary"] = f"{what} on the CPU (the build can offload, but llama.cpp sees no GPU device)"
    else:
        n = plan.get("n_gpu_layers")
        on_gpu = "all" if n is None or n < 0 or (layers and n >= layers) else str(n)
        plan["summary"] = (
            f"{on_gpu} of {layers or '?'} layers (and the output layer, when all) on {', '.join(d['name'] for d in gpus)}"
            f"{' (split by free memory)' if len(gpus) > 1 else ''}; the rest on the CPU"
        )
    return plan


def collect_report(settings: Any, *, run_checks: bool = True, check_timeout_s: float = 120.0) -> dict[str, Any]:
    """The whole report; ``ok`` is False when a wanted engine configuration fails."""
    llama = llama_cpp_info()
    cpu = cpu_info()
    model = _model_info(settings.model)
    checks: list[EngineCheckResult] = []
    if run_checks and llama.get("installed") and model.get("ok"):
        checks = [check_engine(c, timeout_s=check_timeout_s) for c in engine_checks_for(settings)]
    default = next((c for c in checks if c.config == "default"), None)
    hints: list[str] = []
    if not llama.get("installed"):
        hints.append(llama["hint"])
    if not model.get("ok"):
        hints.append(str(model.get("error")))
    for c in checks:
        if c.ok:
            continue
        if c.config == "cpu-repack":
            hints.append(
                "CPU weight repacking crashes here: run without --cpu-repack (the default). "
                "llama.cpp's AMX path is known to crash on some Intel CPUs (llama.cpp issue 20824)."
            )
        elif c.options.get("n_gpu_layers", -1) != 0 and llama.get("gpu_offload"):
            hints.append("the default configuration fails with GPU offload: try --gpu-layers 0 to run on the CPU")
        else:
            hints.append(f"the engine does not run here: {c.error}")
    if cpu["amx"] and not settings.cpu_repack:
        hints.append("this CPU has AMX; p2pinfer keeps llama.cpp's AMX/repack path off by default (it crashes on some such CPUs)")
    cache: dict[str, Any] = {"setting_tokens": settings.cache_tokens}
    if default is not None and default.ok:
        eng = default.report.get("engine", {})
        cache.update(
            capacity_tokens=eng.get("cache_capacity_tokens"),
            kv_bytes_per_token=eng.get("kv_bytes_per_token"),
            capacity_mib=round(eng.get("cache_capacity_tokens", 0) * eng.get("kv_bytes_per_token", 0) / (1 << 20), 1),
            window_tokens=eng.get("cache_window_tokens"),
        )
        if eng.get("cache_window_tokens") is not None:
            hints.append(
                f"this model has a sliding-window KV cache: only prompts of at most {eng['cache_window_tokens']} "
                "tokens are cached (llama.cpp keeps only the last window of those layers, so a longer prompt's "
                "KV cannot be restored exactly); longer prompts are served without the prefix cache"
            )
        model["fingerprint"] = eng.get("fingerprint")
        model["name"] = eng.get("model")
    wanted = [c for c in checks if c.config == "default" or settings.cpu_repack]
    ok = bool(llama.get("installed")) and bool(model.get("ok")) and (not run_checks or (bool(wanted) and all(c.ok for c in wanted)))
    return {
        "ok": ok,
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(), "executable": sys.executable},
        "platform": {"system": platform.system(), "release": platform.release(), "machine": platform.machine()},
        "p2pinfer": __version__,
        "cpu": cpu,
        "llama_cpp": {**llama, "layers": _layer_plan(llama, default, settings.gpu_layers)},
        "model": model,
        "cache": cache,
        "libp2p": libp2p_info(settings),
        "engine_checks": [c.as_dict() for c in checks],
        "hints": hints,
    }
