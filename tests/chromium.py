"""Headless Chromium (Debian's ``chromium`` + ``chromium-driver``, via selenium) for the browser tests
and for ``docs/screenshots.py``.

``.ci/run`` installs both packages; a missing one raises (the test fails, it is never skipped). The
flags are the ones this sandbox needs: no sandbox (root), no GPU, and no background networking (the
network is closed; Chromium's own connections would be refused, many at a time). ``offline=True``
also maps every host name to nowhere, so a page that needs the internet shows it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--hide-scrollbars")


class ChromiumMissing(RuntimeError):
    pass


@contextmanager
def chromium(offline: bool = False, width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A selenium ``webdriver.Chrome`` on headless Chromium, closed on exit."""
    if not CHROMIUM or not CHROMEDRIVER:
        raise ChromiumMissing("chromium and chromedriver are not installed: apt-get install chromium "
                              "chromium-driver (.ci/run does this)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="diagnose-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        opts.add_argument(flag)
    if offline:
        # every host name resolves to nowhere: a page that fetches anything from the internet fails visibly
        opts.add_argument("--host-resolver-rules=MAP * ~NOTFOUND")
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
