"""A screenshot of the dashboard with a local swarm under the MMLU workload (docs/dashboard.png).

Starts ``nodes`` node processes (:class:`~p2pinfer.lab.local_swarm.LocalSwarm`),
opens node 0's ``/dashboard`` in headless Chromium (:mod:`.browser`), sends the
MMLU five-shot workload to random entry nodes while the page watches, asks one
question through the page's "try it" panel, and saves the whole page.
"""

from __future__ import annotations

import base64
from pathlib import Path
import time
from typing import Any

import trio

from .browser import console_errors, headless_chromium
from .live_bench import drive, mmlu_live_requests, summarise, PolicyRun
from .local_swarm import LocalSwarm

__all__ = ["take_dashboard_screenshot"]

TRY_PROMPT = "In one sentence: why do peers share digests of their caches?"


def _wait(fn: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def take_dashboard_screenshot(
    out: Path, *, nodes: int = 4, requests: int = 48, subjects: int = 4, concurrency: int = 2,
    engine: str = "llama-cpp", cache_tokens: int | None = None, seed: int = 1, width: int = 1400,
) -> dict[str, Any]:
    """Run the workload with the page open, save the page as PNG at ``out``; returns what was run."""
    reqs, meta = mmlu_live_requests(requests, nodes, max_subjects=subjects, seed=seed, max_tokens=1)
    node_args = ["--threads", "1"] if engine == "llama-cpp" else []
    if cache_tokens is not None:
        node_args += ["--cache-tokens", str(cache_tokens)]
    driver = headless_chromium(width, 1000)
    try:
        with LocalSwarm(nodes, engine=engine, policy="cost", node_args=node_args, start_timeout_s=180) as swarm:
            swarm.wait_connected(timeout_s=120)
            page = swarm.nodes[0]
            driver.get(page.http + "/dashboard")
            _wait(lambda: driver.execute_script(
                "return window.p2pinferDashboard && window.p2pinferDashboard.state.peers.length") == nodes - 1,
                60, "the page to show every peer")
            t0 = time.perf_counter()
            outcomes = trio.run(drive, [n.http for n in swarm.nodes], reqs, concurrency, None)
            run = PolicyRun("cost", outcomes, time.perf_counter() - t0, [n.peer_id for n in swarm.nodes])
            swarm.check_alive()
            prompt = driver.find_element("id", "try-prompt")
            prompt.clear()
            prompt.send_keys(TRY_PROMPT)
            driver.find_element("id", "try-send").click()
            _wait(lambda: driver.execute_script("return document.getElementById('try-output').dataset.done === '1'"),
                  300, "the try-it answer")
            time.sleep(2.5)  # two more snapshots: the charts and caches after the last request
            driver.execute_script("window.scrollTo(0, 0)")
            height = int(driver.execute_script("return document.documentElement.scrollHeight"))
            # The whole page in one picture: a viewport as tall as the page, then Chromium's own capture.
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                   {"width": width, "height": min(height, 8000), "deviceScaleFactor": 1, "mobile": False})
            time.sleep(1.5)  # the page redraws its charts at the new size with the next snapshot
            shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(base64.b64decode(shot["data"]))
            errors = console_errors(driver)
    finally:
        driver.quit()
    summary = summarise(run)
    return {
        "screenshot": str(out),
        "nodes": nodes,
        "engine": engine,
        "policy": "cost",
        "page": "node 0's /dashboard",
        "workload": {"kind": "mmlu-five-shot", "requests": requests, "concurrency": concurrency,
                     "entry": "random node per request", **meta},
        "completed": summary["completed"],
        "failed": summary["failed"],
        "ttft_ms": summary["ttft_ms"],
        "hit_rate": summary["hit_rate"],
        "browser_console_errors": errors,
    }
