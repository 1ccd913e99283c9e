"""The built site, opened page by page in headless Chromium: no page errors, no request that leaves the machine,
every plotly figure of the chapter drawn, animations that play, maths rendered by the local KaTeX."""
import re

import pytest

from conftest import build_docs
from browser import require_browser, launch, serve, open_page

pytestmark = [pytest.mark.docs, pytest.mark.browser, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def site():
    "The site, built from the chapters (reusing the executions of the notebook tests when they are fresh)."
    return build_docs.build()


@pytest.fixture(scope="module")
def browser():
    require_browser()
    with launch() as b: yield b


def pages(site):
    return sorted(p for p in site.glob("*.html"))


def test_every_chapter_has_a_page(site):
    names = {p.stem for p in pages(site)}
    assert "index" in names and len(names) == len(build_docs.chapters()), (names, build_docs.chapters())
    sidebar = (site / "index.html").read_text()
    for p in pages(site): assert f'href="{p.name}"' in sidebar or p.name == "index.html", f"{p.name} missing from the sidebar"


def _visit(browser, url):
    "Open `url`; return the page, its page errors and every request that left the machine."
    page, errors, outside = open_page(browser, url)
    page.wait_for_timeout(300)
    return page, errors, outside


def test_pages_render_offline(site, browser):
    problems = []
    with serve(site) as base:
        for p in pages(site):
            html = p.read_text()
            page, errors, outside = _visit(browser, f"{base}/{p.name}")
            n_expected = len(re.findall(r"Plotly\.newPlot\(", html))
            if n_expected:
                page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n_expected}", timeout=20000)
            n_drawn = page.evaluate("document.querySelectorAll('.js-plotly-plot').length")
            if errors: problems.append(f"{p.name}: page errors {errors}")
            if outside: problems.append(f"{p.name}: requests leaving the machine {outside}")
            if n_drawn < n_expected: problems.append(f"{p.name}: {n_drawn} of {n_expected} plotly figures drawn")
            if "katex" in html and re.search(r"\\\(|\\\[|\$", page.evaluate("document.querySelector('main') ? document.querySelector('main').innerText : ''")) \
               and page.evaluate("document.querySelectorAll('.katex').length") == 0:
                problems.append(f"{p.name}: maths present but not rendered by KaTeX")
            page.context.close()
    assert not problems, "\n".join(problems)


ANIMATED = "[...document.querySelectorAll('.js-plotly-plot')].filter(g => g._transitionData && g._transitionData._frames && g._transitionData._frames.length > 1)"
SIGNATURE = ("(i) => { const g = " + ANIMATED + "[i]; const s = (g._fullLayout.sliders || [])[0]; "
             "return JSON.stringify([s ? s.active : null, g._fullData.map(t => [t.x && Array.from(t.x).slice(0, 8), t.y && Array.from(t.y).slice(0, 8)])]); }")


def test_animations_play(site, browser):
    "Every figure with frames has a Play button; pressing it moves the figure to a later frame."
    checked = 0
    with serve(site) as base:
        for p in pages(site):
            if 'Plotly.addFrames' not in p.read_text(): continue
            page, errors, _ = _visit(browser, f"{base}/{p.name}")
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0", timeout=20000)
            for i in range(page.evaluate(ANIMATED + ".length")):
                before = page.evaluate(SIGNATURE, i)
                page.evaluate("(i) => { const g = " + ANIMATED + "[i]; g.scrollIntoView(); "
                              "g.querySelector('.updatemenu-button').dispatchEvent(new MouseEvent('click', {bubbles: true})); }", i)
                page.wait_for_timeout(1500)
                assert page.evaluate(SIGNATURE, i) != before, f"{p.name}: animation {i} did not move after pressing Play"
                checked += 1
            assert not errors, f"{p.name}: {errors}"
            page.context.close()
    if checked == 0: pytest.skip("no chapter has an animation yet")
