"""Headless Chromium for the browser tests: Debian's `/usr/bin/chromium` (or Playwright's own), never a download."""
import os, shutil, socket, threading, functools, http.server, contextlib
from pathlib import Path
from urllib.parse import urlparse

import pytest

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
OFFLINE_ARGS = ["--proxy-server=http://127.0.0.1:9"]   # every request but loopback's (never proxied) goes to a closed port: it fails at once


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


_SHARED = []   # the persistent contexts of `launch(cache=True)` now open


@contextlib.contextmanager
def launch(cache:bool=False):
    """A headless Chromium browser (Playwright sync API). With `cache`, one persistent context in a temporary profile instead:
    its disk cache keeps V8's compiled code, so a site's pages after the first few do not compile plotly.js (4.8 MB, about
    2.5 s a page) again; `open_page` opens each page in it (pages share storage: for static sites, not for JupyterLab).
    Playwright's routing turns the cache off, so there a dead proxy, not a route, keeps requests on the machine."""
    import tempfile
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        if cache:
            with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
                ctx = pw.chromium.launch_persistent_context(profile, executable_path=chromium_path(), headless=True,
                                                            args=CHROMIUM_ARGS + OFFLINE_ARGS)
                _SHARED.append(ctx)
                try: yield ctx
                finally: _SHARED.remove(ctx); ctx.close()
            return
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


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    "A static file handler that does not log every request to stderr."
    def log_message(self, *args): pass


@contextlib.contextmanager
def serve(folder):
    "Serve `folder` over HTTP on 127.0.0.1; yields the base URL."
    handler = functools.partial(_QuietHandler, directory=str(folder))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True); t.start()
    try: yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally: srv.shutdown(); srv.server_close()


# Layout checks, run in the page: each returns a list of problems, as sentences (empty: none).
# Boxes are `getBoundingClientRect()`s; a page should be opened at a fixed viewport (e.g. 1280x900) for them.

OVERFLOW_JS = r"""(sel) => {
  const main = document.querySelector(sel) || document.body, out = [];
  const right = main.getBoundingClientRect().left + main.clientWidth;
  const clips = (el) => ['auto', 'scroll', 'hidden', 'clip'].includes(getComputedStyle(el).overflowX);
  const what = (el) => el.tagName.toLowerCase() + (el.classList && el.classList.length ? '.' + [...el.classList].join('.') : '');
  for (const el of main.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.right <= right + 1) continue;
    let p = el.parentElement, shown = true;
    while (p && p !== main) {   // report only the outermost element that sticks out, and nothing a box inside the column clips
      if (p.getBoundingClientRect().right > right + 1 || (clips(p) && p.getBoundingClientRect().right <= right + 1)) { shown = false; break; }
      p = p.parentElement;
    }
    if (shown) out.push(`${what(el)} sticks out of the column by ${Math.round(r.right - right)} px: "${(el.textContent || '').trim().slice(0, 60)}"`);
  }
  for (const pre of main.querySelectorAll('pre.sourceCode')) {
    if (pre.scrollWidth > pre.clientWidth + 1)
      out.push(`a code block hides ${pre.scrollWidth - pre.clientWidth} px of its lines past its right edge (its lines should wrap): "${pre.textContent.trim().slice(0, 60)}"`);
  }
  for (const pre of main.querySelectorAll('pre:not(.sourceCode)')) {   // printed outputs: a claim or a rule is read whole
    if (pre.getBoundingClientRect().width > 0 && pre.scrollWidth > pre.clientWidth + 1)
      out.push(`a printed output hides ${pre.scrollWidth - pre.clientWidth} px of its lines past its right edge (its lines should wrap): "${pre.textContent.trim().slice(0, 60)}"`);
  }
  return out;
}"""

TABLE_PADDING_JS = r"""([sel, min]) => {
  const out = [];
  for (const c of document.querySelectorAll(`${sel} table th, ${sel} table td`)) {
    if (!c.textContent.trim()) continue;
    const cs = getComputedStyle(c), l = parseFloat(cs.paddingLeft), r = parseFloat(cs.paddingRight);
    if (l < min || r < min) out.push(`table cell "${c.textContent.trim().slice(0, 30)}" has ${l} px / ${r} px of padding left / right (< ${min} px)`);
  }
  return out;
}"""

FIGURE_JS = r"""() => {
  const box = (el) => { const r = el.getBoundingClientRect(); return {l: r.left, t: r.top, r: r.right, b: r.bottom}; };
  const meet = (a, b, pad = 0) => a.l < b.r - pad && b.l < a.r - pad && a.t < b.b - pad && b.t < a.b - pad;
  const inside = (a, b, tol = 1) => a.l >= b.l - tol && a.r <= b.r + tol && a.t >= b.t - tol && a.b <= b.b + tol;
  const shown = (el) => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0 && (el.textContent || '').trim() !== ''; };
  const say = (el) => `"${el.textContent.trim().slice(0, 50)}"`;
  const out = [];
  document.querySelectorAll('.js-plotly-plot').forEach((gd, i) => {
    const svg = gd.querySelector('.main-svg'); if (!svg) return;
    const S = box(svg), L = gd._fullLayout || {}, probs = [];
    const name = `figure ${i + 1}` + (L.title && L.title.text ? ` ("${L.title.text.replace(/<[^>]+>/g, ' ').slice(0, 50)}")` : '');
    const titles = [...gd.querySelectorAll('.gtitle')].filter(shown);
    const mb = gd.querySelector('.modebar');
    if (mb && !(gd._context && gd._context.displayModeBar === false))
      [...titles, ...[...gd.querySelectorAll('.legendtext')].filter(shown)].forEach(t => {
        if (meet(box(t), box(mb))) probs.push(`${t.classList.contains('legendtext') ? 'the legend entry' : 'the title'} ${say(t)} runs under the toolbar`); });
    const texts = [...titles, ...gd.querySelectorAll('.annotation-text, .g-xtitle text, .g-ytitle text, .legendtext')].filter(shown);
    for (let a = 0; a < texts.length; a++) for (let b = a + 1; b < texts.length; b++)
      if (meet(box(texts[a]), box(texts[b]), 1)) probs.push(`${say(texts[a])} overlaps ${say(texts[b])}`);
    [...texts, ...gd.querySelectorAll('.xtick text, .ytick text')].filter(shown).forEach(t => {
      if (!inside(box(t), S)) probs.push(`${say(t)} is cut off by the edge of the figure`);
    });
    gd.querySelectorAll('.textpoint text').forEach(t => {
      if (!shown(t)) return;
      const g = t.closest('.trace'), trace = g && g.__data__ && g.__data__[0] && g.__data__[0].trace;
      let area = S, where = 'the edge of the figure';
      if (trace && trace.cliponaxis !== false && trace.xaxis && trace.yaxis) {   // clipped by its axes: must fit the plot area
        const xa = L[trace.xaxis.replace('x', 'xaxis')], ya = L[trace.yaxis.replace('y', 'yaxis')];
        if (xa && ya) { area = {l: S.l + xa._offset, r: S.l + xa._offset + xa._length, t: S.t + ya._offset, b: S.t + ya._offset + ya._length}; where = 'the axes'; }
      }
      if (!inside(box(t), area)) probs.push(`the point label ${say(t)} is cut off by ${where}`);
    });
    [...new Set(probs)].forEach(p => out.push(`${name}: ${p}`));
  });
  return out;
}"""


def column_overflow(page, main="main"):
    "Elements that stick out of the text column `main` (not clipped by a scrolling box inside it), and code blocks or printed outputs whose lines do not wrap."
    return page.evaluate(OVERFLOW_JS, main)


def table_padding(page, main="main", min_px=4):
    "Table cells in `main` with less than `min_px` of padding on the left or right (their text runs into the next cell's)."
    return page.evaluate(TABLE_PADDING_JS, [main, min_px])


def figure_layout(page):
    "Plotly figures whose title runs under the toolbar, whose texts overlap, or whose texts or point labels are cut off."
    return page.evaluate(FIGURE_JS)


def open_page(browser, url, wait_until="load", viewport=None):
    """Open `url` in a fresh context (a fresh page of `launch(cache=True)`'s one context); returns (page, page errors, requests
    that would have left the machine — aborted, or failed at the dead proxy). Close it with `close_page`."""
    outside, errors = [], []
    if hasattr(browser, "new_context"):   # a Browser: a context of the page's own, whose route aborts what would leave
        ctx = browser.new_context(**({"viewport": viewport} if viewport else {}))
        ctx.route("**/*", lambda route: (outside.append(route.request.url), route.abort()) if not is_loopback(route.request.url)
                  else route.continue_())
        page = ctx.new_page()
    else:                                 # the persistent context of `launch(cache=True)`: its dead proxy fails what would leave
        page = browser.new_page()
        if viewport: page.set_viewport_size(viewport)
        page.on("request", lambda r: outside.append(r.url) if not is_loopback(r.url) else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until=wait_until)
    return page, errors, outside


def close_page(page):
    "Close a page `open_page` opened, with its own context (not `launch(cache=True)`'s shared one)."
    if any(page.context is c for c in _SHARED): page.close()   # the shared context outlives its pages
    else: page.context.close()


def console_errors(page):
    "A list that fills with the page's console errors (`console.error`, failed loads) from now on."
    errs = []
    page.on("console", lambda m: errs.append(m.text) if m.type == "error" else None)
    return errs
