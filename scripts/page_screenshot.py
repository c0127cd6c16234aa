"""Make docs/page.png, the README's and the docs' picture of the web page, from the real page in headless Chromium.

    .venv/bin/python scripts/page_screenshot.py                  # starts a server (the default model), writes docs/page.png
    .venv/bin/python scripts/page_screenshot.py --url http://127.0.0.1:8000 --out /tmp/page.png   # a running server

It picks the page's own bundled sample photo (coffee.jpg), compares IDG with IG at the page's default steps, waits for
both panels, and saves the whole page at 1280 pixels wide: what a visitor sees, so the picture cannot drift from the
page. Needs Playwright and Debian's Chromium (``scripts/setup.sh dev`` installs both); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
log = logging.getLogger("page_screenshot")


@contextlib.contextmanager
def served() -> Iterator[str]:
    """A server of this checkout (``python -m app.server``, the default model) on a free loopback port, until the end."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as data:
        env = {**os.environ, "IDG_WARMUP": "false", "IDG_DATA_DIR": data}
        server = subprocess.Popen([sys.executable, "-m", "app.server", "--port", str(port)], cwd=ROOT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                if server.poll() is not None:
                    raise SystemExit(f"the server ended with status {server.returncode} before it was ready")
                with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health/ready", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit("the server was not ready within 300 s")
                time.sleep(0.3)
            yield url
        finally:
            server.terminate()
            server.wait(timeout=60)


def screenshot(url: str, out: Path, chromium: str, sample: str = "coffee.jpg", compare: str = "ig") -> None:
    """The page at ``url`` with ``sample`` explained by IDG and ``compare``, saved whole to ``out``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 980})
            page.goto(url)
            page.click(f"#samples img[alt='{sample}']")
            page.wait_for_selector("#preview:not([hidden])", timeout=30_000)
            page.select_option("#method", "idg")
            page.select_option("#compare", compare)
            page.click("#run")
            for method in ("idg", compare):
                page.wait_for_selector(f".panel[data-method={method}] .status:text-is('done')", timeout=300_000)
            page.wait_for_load_state("networkidle")
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (default: start one of this checkout, with the default model)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "page.png")
    p.add_argument("--sample", default="coffee.jpg", help="one of the page's bundled photos (app/static/samples/)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        log.error("no chromium on the PATH: scripts/setup.sh dev installs Debian's")
        return 2
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(served())
        screenshot(url, args.out, chromium, args.sample)
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
