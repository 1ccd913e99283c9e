"""Headless Chromium for the browser tests: Debian's `/usr/bin/chromium` (or Playwright's own), never a download."""
import os, shutil, socket, threading, functools, http.server, contextlib
from pathlib import Path
from urllib.parse import urlparse

import pytest

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def chromium_path():
    "Path of a Chromium to drive, or None."
    for p in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if p and Path(p).exists(): return p
    return None


def require_browser():
    "Skip (or, under CI / REQUIRE_BROWSER=1, fail) when no Chromium or playwright is available."
    msg = None
    try: import playwright.sync_api  # noqa: F401
    except ImportError: msg = "the `playwright` package is not installed (pip install -e '.[dev]')"
    if msg is None and chromium_path() is None: msg = "no Chromium found: apt-get install chromium (or set CHROMIUM=/path)"
    if msg:
        if os.environ.get("REQUIRE_BROWSER") == "1" or os.environ.get("CI"): pytest.fail(msg)
        pytest.skip(msg)


@contextlib.contextmanager
def launch():
    "A headless Chromium browser (Playwright sync API)."
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try: yield b
        finally: b.close()


def is_loopback(url):
    "True for URLs that stay on this machine (loopback hosts, data: and blob: URLs)."
    u = urlparse(url)
    if u.scheme in ("data", "blob", "about", "chrome-extension"): return True
    return (u.hostname or "") in ("127.0.0.1", "localhost", "::1") or (u.hostname or "").startswith("127.")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


@contextlib.contextmanager
def serve(folder):
    "Serve `folder` over HTTP on 127.0.0.1; yields the base URL."
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a, **k: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True); t.start()
    try: yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally: srv.shutdown(); srv.server_close()


def open_page(browser, url, wait_until="load", viewport=None):
    "Open `url` in a fresh context; returns (page, page errors, requests that would have left the machine — aborted)."
    ctx = browser.new_context(**({"viewport": viewport} if viewport else {}))
    outside, errors = [], []
    ctx.route("**/*", lambda route: (outside.append(route.request.url), route.abort()) if not is_loopback(route.request.url)
              else route.continue_())
    page = ctx.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until=wait_until)
    return page, errors, outside


def console_errors(page):
    "A list that fills with the page's console errors (`console.error`, failed loads) from now on."
    errs = []
    page.on("console", lambda m: errs.append(m.text) if m.type == "error" else None)
    return errs
