"""Headless Chromium for the browser tests (Debian's ``chromium`` + ``chromium-driver``, via selenium).

``.ci/run`` installs both packages. The flags are the ones this sandbox needs: no sandbox (root),
no GPU, and no background networking (the network is closed; Chromium's own connections would be
refused, many at a time). ``offline=True`` also maps every host name to nowhere and turns the
network stack off for anything but the page itself, so a page that needs the internet shows it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def require_chromium() -> None:
    """Fail (not skip) when the browser is missing: CI installs it, so a missing one is a broken setup."""
    if not CHROMIUM or not CHROMEDRIVER:
        pytest.fail("chromium and chromedriver are not installed: apt-get install chromium chromium-driver "
                    "(.ci/run does this)")


@contextmanager
def chromium(offline: bool = False, width: int = 1400, height: int = 1000) -> Iterator[object]:
    """A selenium ``webdriver.Chrome`` on headless Chromium, closed on exit."""
    require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="diagnose-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-extensions", "--disable-default-apps",
                 f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        opts.add_argument(flag)
    if offline:
        # every host name resolves to nowhere: a page that fetches anything from the internet fails visibly
        opts.add_argument("--host-resolver-rules=MAP * ~NOTFOUND")
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER or ""))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
