"""Where a measured figure came from: the command, the commit, the machine and the date.

Every JSON a benchmark or ``p2pinfer simulate --json`` writes carries a
``provenance`` object, so a figure in docs/results.md can be traced to exactly
what produced it (issue 23's rule). It lives outside the lab because the
simulator's command, which is not a lab command, stamps it too.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
import platform
import shlex
import subprocess
import sys
from typing import Any

__all__ = ["git_commit", "provenance", "with_provenance"]


def git_commit(start: str | os.PathLike[str] | None = None) -> str | None:
    """The checkout's commit (with ``-dirty`` when files differ), or None outside git."""
    here = Path(start or Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    args = list(sys.argv[1:] if argv is None else argv)
    return {
        "command": "p2pinfer " + shlex.join(args),
        "commit": git_commit(),
        "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": _cpu_model(), "logical_cores": os.cpu_count(), "python": platform.python_version()},
    }


def with_provenance(result: dict[str, Any], argv: list[str] | None = None) -> dict[str, Any]:
    """``result`` with a ``provenance`` object added (kept if it already has one)."""
    if "provenance" not in result:
        result = {**result, "provenance": provenance(argv)}
    return result
