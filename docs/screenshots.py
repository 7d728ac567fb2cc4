"""Screenshots of the dashboard (and of an HTML report) for the README, in headless Chromium.

    python docs/screenshots.py [SESSION] [--html REPORT.html] [--out docs/img]

Starts the dashboard on SESSION (default: the prefill demo session under tests/data/sessions),
saves the Overview, Timeline and Requests pages as ``dashboard-overview.png``,
``dashboard-timeline.png`` and ``dashboard-requests.png``, and, with ``--html``, the report file as
``report.png``. Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and
selenium. A script, not a test: it waits for the charts to be drawn, then takes the picture.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from diagnose.dashboard import launch  # noqa: E402
from diagnose.errors import DiagnoseError  # noqa: E402
from tests.chromium import ChromiumMissing, chromium  # noqa: E402

DEFAULT_SESSION = os.path.join(ROOT, "tests", "data", "sessions", "prefill_long_prompts_demo")
# (page url path, file name, text that shows the page has rendered)
PAGES = (("", "dashboard-overview.png", "Capture health"),
         ("timeline", "dashboard-timeline.png", "charts have data"),
         ("requests", "dashboard-requests.png", "charts have data"))
COMPARE = ("compare", "dashboard-compare.png", "Lost (")
WIDTH = 1400
MAX_HEIGHT = 3200
WAIT_S = 60.0


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"screenshots: timed out after {timeout_s:.0f} s waiting for {what}.")
        time.sleep(0.25)


def has_text(driver: Any, text: str) -> bool:
    return text in str(driver.find_element("tag name", "body").text)


def plots_drawn(driver: Any) -> bool:
    """Every plotly chart on the page has drawn its SVG."""
    return bool(driver.execute_script(
        "const p = document.querySelectorAll('.js-plotly-plot');"
        "return p.length > 0 && Array.from(p).every(e => e.querySelector('.main-svg'));"))


def streamlit_idle(driver: Any) -> bool:
    """The script run has finished (Streamlit shows its status widget while a run is in progress)."""
    return not driver.execute_script("return document.querySelector('[data-testid=\"stStatusWidget\"]') !== null;")


def fit_height(driver: Any, selector: str) -> None:
    """Make the window as tall as the content (capped), so one screenshot holds the whole page."""
    height = driver.execute_script(
        f"const e = document.querySelector('{selector}'); return e ? e.scrollHeight : document.body.scrollHeight;")
    driver.set_window_size(WIDTH, min(MAX_HEIGHT, int(height) + 120))
    time.sleep(1.0)  # let Streamlit and plotly re-lay-out at the new size


def save(driver: Any, target: str) -> str:
    if not driver.save_screenshot(target):
        raise SystemExit(f"screenshots: could not write {target}.")
    return target


def shoot_dashboard(driver: Any, url: str, out: str, pages: tuple[tuple[str, str, str], ...]) -> list[str]:
    saved = []
    for path, name, marker in pages:
        driver.set_window_size(WIDTH, 1000)
        driver.get(f"{url}/{path}")
        wait_until(f"{marker!r} on /{path}", functools.partial(has_text, driver, marker))
        wait_until(f"the charts on /{path}", lambda: plots_drawn(driver) and streamlit_idle(driver))
        fit_height(driver, '[data-testid="stMainBlockContainer"]')
        wait_until(f"the charts on /{path} after resizing", lambda: plots_drawn(driver))
        time.sleep(1.0)
        saved.append(save(driver, os.path.join(out, name)))
    return saved


def shoot_html(driver: Any, html: str, out: str) -> str:
    url = "file://" + os.path.abspath(html)
    driver.set_window_size(WIDTH, 1000)
    driver.get(url)
    wait_until("the report's charts", lambda: plots_drawn(driver))
    height = int(driver.execute_script("return document.documentElement.scrollHeight;"))
    # load again at the full height instead of resizing a drawn page (a resize re-lays-out every chart)
    driver.set_window_size(WIDTH, min(MAX_HEIGHT, height + 40))
    driver.get(url)
    wait_until("the report's charts", lambda: plots_drawn(driver))
    time.sleep(1.0)
    return save(driver, os.path.join(out, "report.png"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("session", nargs="?", default=DEFAULT_SESSION, help="session folder or .tar.gz")
    ap.add_argument("--html", help="an HTML report file to screenshot too (diagnose report SESSION -o X.html)")
    ap.add_argument("--after", help="a second session: the dashboard compares SESSION (before) with it, and "
                    "the Compare page is saved as dashboard-compare.png")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img"), help="folder for the PNGs (docs/img)")
    args = ap.parse_args(argv)
    if args.html and not os.path.isfile(args.html):
        print(f"screenshots: {args.html} does not exist.", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    try:
        proc, url = launch.start([args.session, *([args.after] if args.after else [])])
    except DiagnoseError as exc:
        print(f"screenshots: {exc}", file=sys.stderr)
        return exc.exit_code
    try:
        pages = PAGES + ((COMPARE,) if args.after else ())
        with chromium(width=WIDTH) as driver:
            saved = shoot_dashboard(driver, url, args.out, pages)
        if args.html:
            with chromium(offline=True, width=WIDTH) as driver:  # offline: the report must draw without the network
                saved.append(shoot_html(driver, args.html, args.out))
    except ChromiumMissing as exc:
        print(f"screenshots: {exc}.", file=sys.stderr)
        return 2
    finally:
        launch.stop(proc)
    for path in saved:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
