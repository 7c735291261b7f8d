"""Headless Chromium for the dashboard's tests and screenshots (Selenium, Debian's packages).

Debian's ``chromium`` and ``chromium-driver`` (``apt-get install -y chromium
chromium-driver``; ``.ci/run`` installs them). Both paths are given to
Selenium, so Selenium Manager never looks for, or downloads, a browser or
a driver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["CHROMEDRIVER", "CHROMIUM", "BrowserUnavailable", "console_errors", "headless_chromium"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


class BrowserUnavailable(RuntimeError):
    """Chromium, its driver or Selenium is not installed."""


def headless_chromium(width: int = 1400, height: int = 1000) -> Any:
    """A headless Chromium driven by Selenium, with the browser console log kept."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        raise BrowserUnavailable(
            f"{' and '.join(missing)} not found: install Debian's packages with "
            "`apt-get install -y chromium chromium-driver` (.ci/run does)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        raise BrowserUnavailable(f"selenium is not installed ({exc}): pip install -e '.[test]'") from None
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps", "--hide-scrollbars", f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def console_errors(driver: Any) -> list[str]:
    """The browser console's errors since the last call (Chromium's log is read once)."""
    return [f"{e.get('source', '')}: {e.get('message', '')}" for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
