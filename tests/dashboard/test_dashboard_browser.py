"""The dashboard (issue 20) in a real headless Chromium against a live local swarm.

Real node processes (``p2pinfer node``, each with its own libp2p host and
HTTP API) with the simulated engine, named as such; the browser is Debian's
``chromium`` driven through ``chromedriver`` by Selenium. A missing browser
fails these tests (it does not skip them).
"""

from __future__ import annotations

from collections.abc import Iterator
import concurrent.futures
import copy
import time
from typing import Any

import httpx
import pytest

from p2pinfer.lab.browser import BrowserUnavailable, console_errors, headless_chromium
from p2pinfer.lab.local_swarm import LocalSwarm

pytestmark = pytest.mark.slow

KEY = "sk-dashboard-test-0123"
PROMPT = ("The following are multiple choice questions (with answers) about astronomy.\n\n"
          "What is the closest star to the Sun?\nA. Sirius\nB. Proxima Centauri\nC. Vega\nD. Betelgeuse\nAnswer:")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        driver = headless_chromium()
    except BrowserUnavailable as exc:
        pytest.fail(f"the dashboard tests need a real browser: {exc}")
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def swarm() -> Iterator[LocalSwarm]:
    with LocalSwarm(3, engine="simulated") as s:
        s.wait_connected(timeout_s=90)
        yield s


@pytest.fixture(scope="module")
def keyed_swarm() -> Iterator[LocalSwarm]:
    with LocalSwarm(2, engine="simulated", node_args=["--api-key", KEY]) as s:
        s.wait_connected(timeout_s=90, api_key=KEY)
        yield s


def until(driver: Any, fn: Any, timeout_s: float = 30.0, what: str = "") -> Any:
    """Poll ``fn(driver)`` until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = fn(driver)
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what or fn}; last value {last!r}")


def js(driver: Any, script: str, *args: Any) -> Any:
    return driver.execute_script(script, *args)


def graph_ids(driver: Any) -> list[str]:
    return js(driver, "return [...document.querySelectorAll('#graph g.peer')].map(g => g.dataset.peerId)")


def open_dashboard(driver: Any, url: str) -> None:
    driver.delete_all_cookies()
    driver.get(url + "/dashboard")
    until(driver, lambda d: js(d, "return window.p2pinferDashboard && window.p2pinferDashboard.state.events >= 2 "
                                  "&& document.getElementById('conn').textContent === 'live'"),
          what="the page's event stream")


def test_page_shows_every_peer_and_marks_this_node_without_console_errors(browser: Any, swarm: LocalSwarm) -> None:
    console_errors(browser)  # start from an empty log
    node = swarm.nodes[1]
    assert node.info["dashboard"] == node.http + "/dashboard"  # what `p2pinfer node` reports (and prints)
    open_dashboard(browser, node.http)
    ids = {n.peer_id for n in swarm.nodes}
    until(browser, lambda d: ids <= set(graph_ids(d)), what="every peer in the graph")
    assert len(graph_ids(browser)) == len(ids)
    assert js(browser, "return document.querySelector('#graph g.self').dataset.peerId") == node.peer_id
    rows = js(browser, "return [...document.querySelectorAll('#peers tbody tr')].map(r => r.dataset.peerId)")
    assert set(rows) == ids
    cards = js(browser, "return [...document.querySelectorAll('#caches .card')].map(c => c.dataset.peerId)")
    assert set(cards) == ids
    states = js(browser, "return [...document.querySelectorAll('#graph g.peer:not(.self)')].map(g => g.dataset.state)")
    assert states == ["eligible"] * (len(ids) - 1)  # wait_connected saw them eligible
    assert js(browser, "return document.getElementById('login').hidden") is True
    assert console_errors(browser) == []


def test_a_routing_decision_shows_within_a_second_of_the_request_finishing(browser: Any, swarm: LocalSwarm) -> None:
    node = swarm.nodes[0]
    open_dashboard(browser, node.http)
    gaps = []
    for i, pause_s in enumerate((0.3, 0.7, 1.1)):  # requests finishing at different points of the stream's cycle
        time.sleep(pause_s)
        resp = httpx.post(node.http + "/v1/completions", json={"prompt": f"{PROMPT} {i}", "max_tokens": 3}, timeout=60)
        finished_ms = time.time() * 1000
        assert resp.status_code == 200, resp.text
        facts = resp.json()["p2pinfer"]
        row = until(browser, lambda d: js(d, """
            const r = document.querySelector('#feed tr[data-request-id="' + arguments[0] + '"]');
            return r ? {shown: Number(r.dataset.shownAt), cells: [...r.cells].map(c => c.textContent)} : null;""",
            facts["request_id"]), timeout_s=10, what="the request's row in the feed")
        gaps.append(row["shown"] - finished_ms)
        when, prompt, served, reason, reuse, prompt_tokens, ttft = row["cells"]
        assert served == ("local" if facts["served_locally"] else facts["served_by"][-6:])
        assert reason == facts["reason"]
        assert reuse == f"{facts['predicted_reused_tokens']} / {facts['reused_tokens']}"
        assert int(prompt_tokens) == facts["prompt_tokens"]
        assert float(ttft) == pytest.approx(facts["ttft_ms"], abs=0.1)
        assert prompt.startswith("The following are multiple choice questions (with answers) about astronomy.")
    assert max(gaps) < 1000, f"rows shown {[round(g) for g in gaps]} ms after their requests finished"
    assert console_errors(browser) == []


def test_the_try_it_panel_streams_an_answer_and_says_where_it_was_served(browser: Any, swarm: LocalSwarm) -> None:
    node = swarm.nodes[2]
    open_dashboard(browser, node.http)
    prompt = browser.find_element("id", "try-prompt")
    prompt.clear()
    prompt.send_keys("Tell me about the planets of the solar system.")
    js(browser, "document.getElementById('try-max-tokens').value = '24'")
    browser.find_element("id", "try-send").click()
    until(browser, lambda d: js(d, "return document.getElementById('try-output').dataset.done === '1'"),
          timeout_s=60, what="the end of the stream")
    chunks = int(js(browser, "return document.getElementById('try-output').dataset.chunks"))
    text = js(browser, "return document.getElementById('try-output').textContent")
    facts = js(browser, "const f = document.getElementById('try-facts'); return [f.dataset.servedBy, f.textContent]")
    assert chunks >= 2 and text.strip(), (chunks, text)  # streamed: one delta per event
    assert facts[0] in {n.peer_id for n in swarm.nodes}
    assert "served by" in facts[1] and "24 tokens" in facts[1]
    # And the request is in the routing feed like any other.
    until(browser, lambda d: js(d, "return document.querySelectorAll('#feed tbody tr').length") >= 1,
          timeout_s=5, what="the try-it request in the feed")
    assert console_errors(browser) == []


def test_a_burst_of_requests_is_batched_into_few_events(browser: Any, swarm: LocalSwarm) -> None:
    node = swarm.nodes[0]
    open_dashboard(browser, node.http)
    before = js(browser, "return window.p2pinferDashboard.state.events")
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(
            lambda i: httpx.post(node.http + "/v1/completions", json={"prompt": f"{PROMPT} {i}", "max_tokens": 1},
                                 timeout=60).json()["p2pinfer"]["request_id"], range(24)))
    wanted = set(replies)
    until(browser, lambda d: wanted <= set(js(d, "return window.p2pinferDashboard.state.decisions.map(x => x.request_id)")),
          timeout_s=10, what="all 24 decisions")
    elapsed = time.monotonic() - t0
    events = js(browser, "return window.p2pinferDashboard.state.events") - before
    # At most one decisions and one snapshot event per 0.2 s push interval, however many requests finish.
    assert events <= 2 * (elapsed / 0.2 + 1), (events, elapsed)


def test_the_page_draws_64_peers_faster_than_its_update_interval(browser: Any, swarm: LocalSwarm) -> None:
    open_dashboard(browser, swarm.nodes[0].http)
    until(browser, lambda d: len(js(d, "return window.p2pinferDashboard.state.peers")) == 2, what="the real peers")
    real = js(browser, "const s = window.p2pinferDashboard.state; return {node: s.node, peers: s.peers, "
                       "groups: s.groups, interval: s.intervalS}")
    peers = []
    for i in range(63):
        p = copy.deepcopy(real["peers"][i % 2])
        p["peer_id"] = f"12D3KooWsynthetic{i:04d}"
        p["busy"] = i % 7 == 0
        peers.append(p)
    snapshot = {"no": 10**6, "time": time.time(), "node": real["node"], "peers": peers, "groups": real["groups"],
                "point": {"time": time.time(), "requests": 0}}
    js(browser, "const s = window.p2pinferDashboard.state; if (s.source) { s.source.close(); s.source = null; }")
    # (the live stream is closed: its next snapshot would replace the synthetic one)
    js(browser, "window.p2pinferDashboard.apply('snapshot', arguments[0])", snapshot)
    assert len(graph_ids(browser)) == 64
    assert js(browser, "return document.querySelectorAll('#peers tbody tr').length") == 64
    assert js(browser, "return document.querySelectorAll('#caches .card').length") == 64
    render_ms = js(browser, "return window.p2pinferDashboard.state.renderMs")
    assert render_ms < real["interval"] * 1000, f"drawing 64 peers took {render_ms:.0f} ms"


def test_with_an_api_key_the_page_refuses_without_login_and_works_after(browser: Any, keyed_swarm: LocalSwarm) -> None:
    node = keyed_swarm.nodes[0]
    assert httpx.get(node.http + "/dashboard").status_code == 200  # the page itself holds no data
    assert httpx.get(node.http + "/dashboard/events").status_code == 401
    assert httpx.get(node.http + "/status").status_code == 401
    console_errors(browser)
    browser.delete_all_cookies()
    browser.get(node.http + "/dashboard")
    until(browser, lambda d: js(d, "return !document.getElementById('login').hidden"), what="the login form")
    time.sleep(1.5)
    assert js(browser, "return window.p2pinferDashboard.state.events") == 0
    assert js(browser, "return document.getElementById('dashboard').hidden") is True
    refused = js(browser, "return fetch('/status').then(r => r.status)")
    assert refused == 401
    browser.find_element("id", "login-key").send_keys("sk-wrong-key-00000")
    browser.find_element("id", "login-send").click()
    until(browser, lambda d: "Incorrect API key" in js(d, "return document.getElementById('login-error').textContent"),
          what="the wrong key refused")
    key = browser.find_element("id", "login-key")
    key.clear()
    key.send_keys(KEY)
    browser.find_element("id", "login-send").click()
    ids = {n.peer_id for n in keyed_swarm.nodes}
    until(browser, lambda d: ids <= set(graph_ids(d)), what="every peer after login")
    assert "p2pinfer_session" not in js(browser, "return document.cookie")  # HttpOnly
    # The cookie authorises reads; a POST needs the page's header too (no cross-site form posts).
    assert js(browser, "return fetch('/status').then(r => r.status)") == 200
    bare = js(browser, "return fetch('/v1/completions', {method: 'POST', headers: {'Content-Type': 'application/json'},"
                       "body: JSON.stringify({prompt: 'hi', max_tokens: 1})}).then(r => r.status)")
    assert bare == 403
    browser.find_element("id", "try-send").click()
    until(browser, lambda d: js(d, "return document.getElementById('try-output').dataset.done === '1'"),
          timeout_s=60, what="the try-it answer after login")
    assert int(js(browser, "return document.getElementById('try-output').dataset.chunks")) >= 1
    errors = console_errors(browser)
    unexpected = [e for e in errors if not any(s in e for s in ("/dashboard/login", "/status", "/v1/completions"))]
    assert unexpected == []
    browser.find_element("id", "logout").click()
    until(browser, lambda d: js(d, "return !document.getElementById('login').hidden"), what="the login form again")
    assert js(browser, "return fetch('/status').then(r => r.status)") == 401
