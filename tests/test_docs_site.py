"""The built site, opened page by page in headless Chromium: no page errors, no request that leaves the machine,
every plotly figure of the chapter drawn, animations that play, maths rendered by the local KaTeX; and a layout a
reader can read at a desktop width: nothing sticks out of the text column (code wraps), table cells have padding,
figure titles clear plotly's toolbar, and no text of a figure overlaps another or is cut off.

DOCS_SITE=folder tests a site already built there instead of building one (e.g. `_docs/` of an earlier build)."""
import json, os, re, time
from pathlib import Path

import pytest

from conftest import build_docs, shared_dir
from browser import require_browser, launch, serve, open_page, close_page, column_overflow, table_padding, figure_layout

pytestmark = [pytest.mark.docs, pytest.mark.browser, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def site():
    "The site, built from the chapters (reusing the executions of the notebook tests when they are fresh)."
    if os.environ.get("DOCS_SITE"): return Path(os.environ["DOCS_SITE"])
    return build_docs.build()


@pytest.fixture(scope="module")
def browser():
    "One Chromium profile for the module: pages after the first few reuse its compiled plotly.js (`launch(cache=True)`)."
    require_browser()
    with launch(cache=True) as b: yield b


@pytest.fixture(scope="module")
def base(site):
    "The site served for the whole module, at one address (the browser's cache is kept per address)."
    with serve(site) as b: yield b


def pages(site):
    "The site's pages: the front page and every chapter's, in its part's folder (not the site's own files)."
    return sorted(p for p in site.rglob("*.html") if p.relative_to(site).parts[0] not in ("site_libs", "katex"))


def page_file(site, name)->Path:
    "The page called `name` (e.g. 'editor.html'), in whichever part's folder it is."
    hits = [p for p in pages(site) if p.name == name]
    assert len(hits) == 1, (name, hits)
    return hits[0]


def url(base, site, p)->str:
    "The address of page `p` on the site served at `base`."
    return f"{base}/{p.relative_to(site).as_posix()}"


def test_every_chapter_has_a_page(site):
    "Every chapter has its page, in its part's folder as in `nbs/`; the sidebar lists them in reading order, a section a part."
    import html
    want = [build_docs.page_path(nb) for nb in build_docs.chapters()]
    assert sorted(p.relative_to(site).as_posix() for p in pages(site)) == sorted(want)
    sidebar = (site / "index.html").read_text()
    listed = [h for h in dict.fromkeys(re.findall(r'href="([^"#]+\.html)"', sidebar)) if h in want]
    assert listed == ["index.html"] + [w for w in want if w != "index.html"], listed
    for title in build_docs.PARTS.values(): assert html.escape(title) in sidebar, f"no sidebar section {title!r}"


def test_class_source():
    "A class's `show_doc` signature on the site: a dataclass with its fields, a class with its `__init__`, not `def Name(...)->None:`."
    from spline_transformers.model import TransformerConfig, Transformer
    from spline_transformers.splines import BackendChoice
    from spline_transformers.cli import UsageError
    from spline_transformers.core import Batch
    src = build_docs.class_source(TransformerConfig)
    assert src.startswith("@dataclass\nclass TransformerConfig:\n    vocab_size:int # ") and "\n    n_layers:int=2 # " in src, src
    assert build_docs.class_source(BackendChoice).startswith("@dataclass(frozen=True)\nclass BackendChoice:\n    name:str"), build_docs.class_source(BackendChoice)
    src = build_docs.class_source(Transformer)
    assert src.startswith("class Transformer(nn.Module):\n    def __init__(\n        self,\n        cfg:TransformerConfig, # "), src
    assert build_docs.class_source(UsageError) == "class UsageError(ValueError):\n    ...", build_docs.class_source(UsageError)
    assert build_docs.class_source(Batch).startswith("class Batch(NamedTuple):\n    x:"), build_docs.class_source(Batch)
    md = ("[source](https://github.com/o/r/blob/main/spline_transformers/model.py#L54){target=\"_blank\"}\n\n### TransformerConfig\n\n"
          "```python\ndef TransformerConfig(\n    vocab_size:int, n_layers:int=2\n)->None:\n```\n\n*The architecture.*")
    assert build_docs._SHOWDOC_CLASS.search(md) and build_docs._resolve("TransformerConfig", md) is TransformerConfig


def test_classes_render_as_classes(site):
    "No page shows a class's signature as a function (`def Name(...)`); the dataclass `TransformerConfig` shows its fields."
    import importlib, pkgutil, html as H
    import spline_transformers
    classes = {n for m in pkgutil.iter_modules(spline_transformers.__path__) if not m.name.startswith("_")
               for n, o in vars(importlib.import_module(f"spline_transformers.{m.name}")).items() if isinstance(o, type)}
    bad = []
    for p in pages(site):
        text = H.unescape(re.sub(r"<[^>]+>", "", p.read_text()))
        bad += [f"{p.name}: def {n}(...)" for n in re.findall(r"^def ([A-Z]\w*)\(", text, re.M) if n in classes]
    assert not bad, "\n".join(bad)
    text = H.unescape(re.sub(r"<[^>]+>", "", page_file(site, "model.html").read_text()))
    assert "@dataclass\nclass TransformerConfig:\n    vocab_size:int # " in text


def _visit(browser, url):
    "Open `url`; return the page, its page errors and every request that left the machine."
    page, errors, outside = open_page(browser, url)
    page.wait_for_timeout(300)
    return page, errors, outside


def _render_problems(page, html:str, n_expected:int, errors:list, outside:list)->list:
    "What a page shows wrong when served offline: page errors, requests leaving the machine, undrawn figures, unrendered maths."
    problems, n_drawn = [], page.evaluate("document.querySelectorAll('.js-plotly-plot').length")
    if errors: problems.append(f"page errors {errors}")
    if outside: problems.append(f"requests leaving the machine {outside}")
    if n_drawn < n_expected: problems.append(f"{n_drawn} of {n_expected} plotly figures drawn")
    if "katex" in html and re.search(r"\\\(|\\\[|\$", page.evaluate("document.querySelector('main') ? document.querySelector('main').innerText : ''")) \
       and page.evaluate("document.querySelectorAll('.katex').length") == 0:
        problems.append("maths present but not rendered by KaTeX")
    return problems


def test_pages_render_offline(visits):
    "Every page, served with the machine offline: no page error, no request leaves it, every figure is drawn, maths is rendered."
    assert not visits["render"], "\n".join(visits["render"])


ANIMATED = "[...document.querySelectorAll('.js-plotly-plot')].filter(g => g._transitionData && g._transitionData._frames && g._transitionData._frames.length > 1)"
SIGNATURE = ("(i) => { const g = " + ANIMATED + "[i]; const s = (g._fullLayout.sliders || [])[0]; "
             "return JSON.stringify([s ? s.active : null, g._fullData.map(t => [t.x && Array.from(t.x).slice(0, 8), t.y && Array.from(t.y).slice(0, 8)])]); }")


def test_animations_play(site, browser, base):
    "Every figure with frames has a Play button; pressing it moves the figure to a later frame."
    checked = 0
    for p in pages(site):
        if 'Plotly.addFrames' not in p.read_text(): continue
        page, errors, _ = _visit(browser, url(base, site, p))
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0", timeout=20000)
        for i in range(page.evaluate(ANIMATED + ".length")):
            before = page.evaluate(SIGNATURE, i)
            page.evaluate("(i) => { const g = " + ANIMATED + "[i]; g.scrollIntoView(); "
                          "g.querySelector('.updatemenu-button').dispatchEvent(new MouseEvent('click', {bubbles: true})); }", i)
            page.wait_for_timeout(1500)
            assert page.evaluate(SIGNATURE, i) != before, f"{p.name}: animation {i} did not move after pressing Play"
            checked += 1
        assert not errors, f"{p.name}: {errors}"
        close_page(page)
    if checked == 0: pytest.skip("no chapter has an animation yet")


DESKTOP = {"width": 1280, "height": 900}
SHOTS = os.environ.get("DOCS_SHOTS")   # a folder: save a screenshot of each page with a layout problem there


def _open_drawn(browser, base, site, page_path):
    "Open a page at a desktop width and wait until its plotly figures are drawn and KaTeX has run."
    page, errors, _ = open_page(browser, url(base, site, page_path), viewport=DESKTOP)
    _wait_drawn(page, len(re.findall(r"Plotly\.newPlot\(", page_path.read_text())))
    return page


def _wait_drawn(page, n:int):
    "Wait until a page's `n` plotly figures are drawn and KaTeX has run."
    if n: page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n}", timeout=20000)
    page.wait_for_timeout(500)


CHECKS = {"overflow": column_overflow, "tables": table_padding, "figures": figure_layout}


VISIT_SHARES = 4   # the pages are visited in this many shares, every page in one: each worker that asks takes the shares no one has


@pytest.fixture(scope="module")
def visits(site, browser, base, tmp_path_factory):
    """`visit_pages`, once for the whole test run: each worker that asks claims the shares of the pages that no worker has
    claimed yet and visits them in its module's browser (so that under pytest-xdist both workers visit at once, where a lock
    would leave one idle), then waits for the others' shares; the problems of every share, merged. (The `browser` fixture
    skips before anything is claimed; one thread can hold one Playwright, so the visits use that browser, not a second.)"""
    shared = shared_dir(tmp_path_factory) / "docs_visits"
    shared.mkdir(exist_ok=True)
    every = pages(site)
    for i in range(VISIT_SHARES):
        try: (shared / f"{i}.claimed").mkdir()   # atomic: one worker visits each share
        except FileExistsError: continue
        try: found = visit_pages(site, browser, base, every[i::VISIT_SHARES])
        except BaseException as e:   # say so, or the other worker would wait for this share until its timeout
            (shared / f"{i}.error").write_text(f"{type(e).__name__}: {e}"); raise
        (shared / f"{i}.json.tmp").write_text(json.dumps(found)); (shared / f"{i}.json.tmp").rename(shared / f"{i}.json")
    t0 = time.time()
    while not all((shared / f"{i}.json").is_file() for i in range(VISIT_SHARES)):
        failed = sorted(shared.glob("*.error"))
        if failed: pytest.fail(f"share {failed[0].stem} of the page visits failed on another worker: {failed[0].read_text()[:2000]}")
        assert time.time() - t0 < 1200, f"the other worker's share of the page visits did not finish in 1200 s: {sorted(os.listdir(shared))}"
        time.sleep(0.5)
    merged = {}
    for i in range(VISIT_SHARES):
        for check, problems in json.loads((shared / f"{i}.json").read_text()).items(): merged.setdefault(check, []).extend(problems)
    return merged


def visit_pages(site, browser, base, only=None)->dict:
    """Each page opened once, for every check that reads a page as it stands (one load a page, not one a check): loaded at a
    desktop width for `_render_problems` and `CHECKS`; then, if it has a figure, narrowed to 900 px with its sidebar opened
    over the page and widened to 992 px (`test_figures_fit_narrow_windows`). Returns the problems each check finds, as
    `{check: ["page: problem"]}` (checks: render, overflow, tables, figures, narrow); `only`: these pages (default: all)."""
    found = {k: [] for k in ("render", *CHECKS, "narrow")}
    for p in (pages(site) if only is None else only):
        html = p.read_text()
        n = len(re.findall(r"Plotly\.newPlot\(", html))
        page, errors, outside = open_page(browser, url(base, site, p), viewport=DESKTOP)
        _wait_drawn(page, n)
        checks = {"render": lambda page: _render_problems(page, html, n, errors, outside), **CHECKS}
        if n: checks["narrow"] = lambda page: [f for viewport, sidebar in NARROW for f in _narrow_problems(page, viewport, sidebar)]
        for name, check in checks.items():
            problems = check(page)
            found[name] += [f"{p.name}: {f}" for f in problems]
            if problems and SHOTS: page.screenshot(path=str(Path(SHOTS) / f"site_{name}_{p.stem}.png"), full_page=True)
        close_page(page)
    return found


def _report(problems, most=40):
    return "\n".join(problems[:most]) + (f"\n... {len(problems)} in all" if len(problems) > most else "")


def test_nothing_sticks_out_of_the_column(visits):
    "No element is wider than the text column (wide tables and outputs scroll in their own box), and code lines wrap."
    assert not visits["overflow"], _report(visits["overflow"])


def test_table_cells_have_padding(visits):
    "Every table cell keeps its text clear of its neighbours' (pandas' tables come with 1-2 px)."
    assert not visits["tables"], _report(visits["tables"])


def test_figures_titles_and_labels_are_readable(visits):
    "Titles clear the toolbar; no two texts of a figure overlap; no text or point label is cut off by the figure or its axes."
    assert not visits["figures"], _report(visits["figures"])


def test_findings_page_is_a_table_to_read(site):
    """Issue 28 (9): the book's conclusion opens on an HTML table: whole claims, links that lead to pages of the site,
    numbers in the paper's units, no index column, no DataFrame truncation (`...`) and no code before it."""
    import html as H
    from spline_transformers.results import EXPERIMENTS  # results imports the registry
    findings = page_file(site, "findings.html")
    page = findings.read_text()
    m = re.search(r'<table class="dataframe findings">.*?</table>', page, re.S)
    assert m, "findings.html has no findings table"
    table, text = m.group(0), H.unescape(re.sub(r"<[^>]+>", "", m.group(0)))
    hrefs = re.findall(r'<a href="([^"]+)"', table)
    assert hrefs and all((findings.parent / h).is_file() for h in hrefs), [h for h in hrefs if not (findings.parent / h).is_file()]
    assert not re.search(r"\[\w+\]\(\w+\.html\)", text), "a chapter link is shown as raw markdown"
    assert "..." not in text and "…" not in text, "a cell of the table is cut"
    for n, e in EXPERIMENTS.items(): assert " ".join(e.claim.split()) in " ".join(text.split()), f"{n}: its claim is not whole"
    assert "final_test" not in text and re.search(r"\d pp test accuracy", text) and "×" in text
    assert not re.search(r"<th>\s*</th>|<th>\s*\d+\s*</th>", table), "an index column"
    first_code = page.find('class="sourceCode')
    assert first_code == -1 or m.start() < first_code, "code comes before the table"


def test_findings_table_fits_the_column(site, browser, base):
    "Issue 28 (9): the findings table is read without scrolling sideways: it fits the text column, its links are in view."
    page = _open_drawn(browser, base, site, page_file(site, "findings.html"))
    fit = page.evaluate("""() => { const t = document.querySelector('main table.findings'), m = document.querySelector('main');
        if (!t) return null; const right = m.getBoundingClientRect().left + m.clientWidth;
        return {table: t.getBoundingClientRect().right, box: t.parentElement.scrollWidth - t.parentElement.clientWidth, right,
                links: [...t.querySelectorAll('a')].filter(a => a.getBoundingClientRect().right > right + 1).map(a => a.textContent)}; }""")
    close_page(page)
    assert fit is not None, "no findings table on findings.html"
    assert fit["table"] <= fit["right"] + 1 and fit["box"] <= 1 and not fit["links"], fit


NARROW = [({"width": 900, "height": 900}, True), ({"width": 992, "height": 900}, False)]   # in the order a page sees them
NARROW_PROBLEMS = ("cut off by", "under the toolbar")   # titles, axis titles, legend entries and point labels
FOLLOWED = ("[...document.querySelectorAll('.js-plotly-plot')].every(g => !g._fullLayout || g._fullLayout.autosize === false || "
            "g.layout.width || Math.abs(g._fullLayout.width - g.getBoundingClientRect().width) < 1)")


def _narrow_problems(page, viewport, open_sidebar):
    "figure_layout's problems of an open page resized to `viewport` (after opening the sidebar over the page when `open_sidebar`)."
    page.set_viewport_size(viewport)   # a resize, as a reader's: the column narrows, the figures follow it
    if open_sidebar:
        page.locator(".quarto-btn-toggle").first.click()
    page.wait_for_function(FOLLOWED, timeout=20000)   # plotly has redrawn every figure at its box's width (after a resize)
    page.wait_for_timeout(600)
    where = f"{viewport['width']} px{' (sidebar open)' if open_sidebar else ''}"
    return [f"{where}: {p}" for p in figure_layout(page) if any(k in p for k in NARROW_PROBLEMS)]


def test_figures_fit_narrow_windows(visits):
    """Issue 28 (7): at 992 px the sidebar stays docked and the text column is at its narrowest (about 360 px); at 900 px the
    sidebar opens over the page. Every page with a figure, drawn at a desktop width, is resized to 900 px and its sidebar
    opened, then to 992 px (the column narrows from about 850 px: the figures must follow each resize): in both, no figure title,
    axis title, legend entry or point label is cut off or under plotly's toolbar (the site's `fit_figures.js` fits titles
    to the width a figure is drawn at)."""
    assert not visits["narrow"], _report(visits["narrow"], most=80)


LIVE = (("editor.html", 16, -50), ("add.html", 22, 70))   # page, knot, pixels to drag it (the sin(2x) fit's x = 0; ADD's spike at x = 0.6)


def test_live_editors_answer_on_the_site(site, browser, base):
    """Issue 28 (1, 4): with no kernel, a knot dragged with the mouse in the editor chapter's (10a) "Break GeLU" editor and in chapter 11's
    ADD editor changes the loss or accuracy the page computes and shows, and it equals the library's for the spline the page
    used within 1e-4 (`live_page.check_drag`); the model file comes from beside the page; no request leaves 127.0.0.1, no
    console error."""
    from browser import console_errors
    from live_page import live_editors, check_drag
    with_live = {p.name for p in pages(site) if "stLive.register(" in p.read_text()}
    assert {name for name, _, _ in LIVE} <= with_live, with_live
    for name, k, dy in LIVE:
        where = page_file(site, name)
        page, errors, outside = open_page(browser, url(base, site, where), viewport=DESKTOP)
        console = console_errors(page)
        page.reload()                                   # with the console listened to from the start
        n = len(re.findall(r"Plotly\.newPlot\(", where.read_text()))
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n}", timeout=30_000)
        ids = live_editors(page)
        assert len(ids) == 1, (name, ids)
        before, after, lib = check_drag(page, ids[0], k, dy, site=where.parent)   # its model file is beside it
        if SHOTS: page.screenshot(path=str(Path(SHOTS) / f"site_live_{Path(name).stem}.png"), full_page=False)
        assert not errors and not console, (name, errors, console)
        assert not outside, (name, outside)
        close_page(page)


def test_construction_runs_on_the_site(site, browser, base):
    """Issue 28 (2): with no kernel, the playground of chapter 21 builds the hardmax interpolator for its data when **build**
    is pressed, and its block count, formula and every token's end (within 1e-6) are the library's for the dataset the page
    used (`test_construction_page.check_against_library`); no request leaves 127.0.0.1, no console error."""
    from browser import console_errors
    from test_construction_page import playground_ids, build_in_page, check_against_library
    where = page_file(site, "interpolation_theory.html")
    assert "stConstruct.register(" in where.read_text()
    page, errors, outside = open_page(browser, url(base, site, where), viewport=DESKTOP)
    console = console_errors(page)
    page.reload()
    page.wait_for_function("() => window.stConstruct && Object.keys(window.stConstruct.specs).length > 0", timeout=60_000)
    ids = playground_ids(page)
    assert len(ids) == 1, ids
    T = check_against_library(build_in_page(page, ids[0]))
    assert T.n_blocks == 15
    if SHOTS: page.screenshot(path=str(Path(SHOTS) / "site_construction.png"), full_page=False)
    assert not errors and not console, (errors, console)
    assert not outside, outside
    close_page(page)
