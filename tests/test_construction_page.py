"""Issue 28 (2): the construction in the page. The page's JavaScript twin of the hardmax builder (`CONSTRUCTION_JS`,
chapter 21) against the library's `build_interpolator`: run in Node (when there is one) on small datasets, the block
count equals the library's and every token ends within 1e-6 of where the library puts it; with the library given the
page's directions (`page_directions`), every token agrees after every block. In headless Chromium, on a plain page with
only plotly.min.js (no kernel, no site build): tokens and targets placed with the mouse, one dragged, **build** pressed,
and the page's block count, formula and final positions are the library's for the dataset the page used; no request
leaves 127.0.0.1, no console error. The same check on the built site is
`test_docs_site.py::test_construction_runs_on_the_site`."""
import json, shutil, subprocess
from pathlib import Path

import numpy as np
import pytest

import spline_transformers.interpolation as interp
from spline_transformers.interpolation import build_interpolator, random_dataset, toy_dataset, expected_blocks, InterpolationDataError
from spline_transformers.interpolation_theory import (CONSTRUCTION_JS, ConstructionPlayground, page_directions,
                                                      construction_page_html, construction_summary)

NODE = shutil.which("node")


def run_js(datasets):
    "The page's builder (`stConstruct.run`) on each (X, Y), in Node: its result, or {kind, message} when it refuses."
    prog = ("var C0 = (function() {\n" + CONSTRUCTION_JS + "\nreturn C; })();\nvar data = " + json.dumps(datasets) + ";\n"
            "console.log(JSON.stringify(data.map(function(D) { try { return C0.run(D[0], D[1]); }"
            " catch (e) { return {kind: e.kind || e.name, message: e.message}; } })));")
    r = subprocess.run([NODE, "-e", prog], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def as_lists(X, Y): return [np.asarray(x).tolist() for x in X], [np.asarray(y).tolist() for y in Y]


def grid_dataset(rng):
    "Tokens on the 0.1 grid a reader's clicks snap to, shared between sequences."
    pool = np.unique(rng.integers(-20, 21, size=(8, 2)), axis=0) / 10
    N, X, Y, seen = int(rng.integers(1, 5)), [], [], set()
    while len(X) < N:
        n = int(rng.integers(1, min(6, len(pool)) + 1)); idx = tuple(sorted(rng.choice(len(pool), n, replace=False).tolist()))
        if idx in seen: continue
        seen.add(idx); X.append(pool[list(idx)])
        Y.append(np.unique(rng.integers(-20, 21, size=(int(rng.integers(1, n + 1)), 2)), axis=0) / 10)
    return X, Y


def datasets():
    rng = np.random.default_rng(1)
    return ([toy_dataset()] + [random_dataset(N, 2, n=(1, 6), pool=7, seed=s) for s, N in enumerate([2, 3, 4, 5, 6])]
            + [random_dataset(3, 2, n=(2, 5), seed=9)] + [grid_dataset(rng) for _ in range(12)])


@pytest.mark.skipif(NODE is None, reason="no node: the page's builder is checked in Chromium only")
def test_page_builder_matches_the_library(monkeypatch):
    sets = [as_lists(X, Y) for X, Y in datasets()]
    out = run_js(sets)
    worst_final = worst_block = 0.0
    for (X, Y), r in zip(sets, out):
        assert "kind" not in r, r
        T = build_interpolator(X, Y)                                   # the library as it is: random directions
        assert r["n_blocks"] == T.n_blocks == r["expected"] == expected_blocks(Y)
        assert r["error"] < 1e-12 * r["scale"]
        for j, x in enumerate(X): worst_final = max(worst_final, float(np.abs(np.array(r["finals"][j]) - T(x).numpy()).max()))
        with monkeypatch.context() as m:                               # the library with the page's directions
            m.setattr(interp, "_units", lambda rng, k, d: page_directions(k, d))
            Tp = build_interpolator(X, Y)
        assert [(b.stage, b.padding) for b in Tp.blocks] == [(b["stage"], b["padding"]) for b in r["blocks"]]
        for j, x in enumerate(X):
            pos, _ = Tp.trajectory(np.array(x), per="block")
            worst_block = max(worst_block, float(np.abs(np.array(r["trajectories"][j]) - pos).max()))
    assert worst_final < 1e-6 and worst_block < 1e-6, (worst_final, worst_block)


@pytest.mark.skipif(NODE is None, reason="no node: the page's builder is checked in Chromium only")
def test_page_refuses_what_the_library_refuses():
    a, b = [0.1, 0.2], [0.5, -0.3]
    bad = [([[a, a]], [[b]], "repeated input tokens"), ([[a, b], [b, a]], [[a], [b]], "same token set"),
           ([[a]], [[a], [b]]  , "one target per input"), ([[a]], [[a, b]], "m_j must satisfy")]
    out = run_js([[X, Y] for X, Y, _ in bad])
    for (X, Y, what), r in zip(bad, out):
        with pytest.raises(InterpolationDataError, match=what): build_interpolator(X, Y)
        assert r.get("kind") == "InterpolationDataError" and what in r["message"], r


def test_playground_in_the_kernel():
    play = ConstructionPlayground()
    T = play.build()
    X, Y = toy_dataset()
    assert T.n_blocks == 15 and construction_summary(15, [1, 1, 2], play.result["stages"], float(np.max(T.info["hausdorff"]))) in play.status.value
    assert "2·(1 + 1 + 2) + 2·3 + 1 = 15 blocks" in play.status.value
    play.add(0.2, 0.9, seq=2)                                           # the toy's token a, now also in sequence 2
    play.add(0.9, 0.4, seq=2)                                           # b, which sequence 2 holds already
    assert play.build() is None and "sequence 2: repeated input tokens" in play.status.value
    play.undo(); assert play.build().n_blocks == 15
    play.clear(); assert play.build() is None and "place a token" in play.status.value
    with pytest.raises(ValueError, match="at most 4 sequences"): ConstructionPlayground(*random_dataset(5, 2, seed=0))
    with pytest.raises(IndexError, match="there is no point 3"): play.move(3, 0.0, 0.0)
    html = construction_page_html(ConstructionPlayground().items)
    assert "stConstruct.register(" in html and html.count("window.stConstruct = C") == 1


@pytest.fixture(scope="module")
def browser():
    from browser import require_browser, launch
    require_browser()
    with launch() as b: yield b


PAGE_STATE = """(pid) => { const r = document.getElementById(pid + '-readout');
    return {state: r.dataset.state, text: r.textContent, blocks: r.dataset.blocks ? +r.dataset.blocks : null,
            expected: r.dataset.expected ? +r.dataset.expected : null, error: r.dataset.error ? +r.dataset.error : null,
            dataset: r.dataset.dataset ? JSON.parse(r.dataset.dataset) : null, finals: r.dataset.finals ? JSON.parse(r.dataset.finals) : null,
            label: document.getElementById(pid + '-label').textContent}; }"""


def playground_ids(page): return page.evaluate("() => Object.keys((window.stConstruct && window.stConstruct.specs) || {})")


def click_at(page, pid, x, y):
    "Click the figure where the data point (x, y) is, and wait until the page has added the point (a busy machine redraws late)."
    n = page.evaluate("(pid) => window.stConstruct.specs[pid].items.length", pid)
    px, py = page.evaluate("""([pid, x, y]) => { const gd = document.getElementById(pid), L = gd._fullLayout, r = gd.querySelector('.main-svg').getBoundingClientRect();
        return [r.left + L.xaxis._offset + L.xaxis.d2p(x), r.top + L.yaxis._offset + L.yaxis.d2p(y)]; }""", [pid, x, y])
    page.mouse.click(px, py)
    page.wait_for_function("([pid, n]) => window.stConstruct.specs[pid].items.length > n", arg=[pid, n], timeout=10_000)
    page.wait_for_timeout(200)   # the redraw after the new point, before the next click reads the axes


def build_in_page(page, pid, timeout=30_000):
    "Press build; the page's answer once it is in."
    runs = page.evaluate("(pid) => window.stConstruct.specs[pid].runs || 0", pid)
    page.click(f"button[id='{pid}-build']")
    page.wait_for_function("([pid, n]) => (window.stConstruct.specs[pid].runs || 0) > n && document.getElementById(pid + '-readout').dataset.state !== 'ready'",
                           arg=[pid, runs], timeout=timeout)
    return page.evaluate(PAGE_STATE, pid)


def check_against_library(ans):
    "The page's build equals the library's for the dataset the page used: block count, formula, every token's end within 1e-6."
    assert ans["state"] == "done", ans["text"]
    X, Y = ans["dataset"]["X"], ans["dataset"]["Y"]
    T = build_interpolator(X, Y)
    assert ans["blocks"] == ans["expected"] == T.n_blocks == expected_blocks(Y), (ans["blocks"], T.n_blocks)
    assert f"= {T.n_blocks} blocks; built: {T.n_blocks} (" in ans["text"] and "built in this page" in ans["text"], ans["text"]
    for j, x in enumerate(X): assert np.abs(np.array(ans["finals"][j]) - T(x).numpy()).max() < 1e-6, j
    assert ans["error"] < 1e-9
    return T


def test_playground_builds_in_the_page(browser, tmp_path):
    import plotly
    from browser import serve, open_page, console_errors
    shutil.copy2(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", tmp_path / "plotly.min.js")
    body = ConstructionPlayground()._repr_mimebundle_()["text/html"]
    (tmp_path / "index.html").write_text('<!doctype html><html><head><meta charset="utf-8"><script src="plotly.min.js"></script>'
                                          f"</head><body style='width:900px'>{body}</body></html>")
    with serve(tmp_path) as base:
        page, errors, outside = open_page(browser, f"{base}/index.html", viewport={"width": 1000, "height": 1000})
        console = console_errors(page)
        page.reload()
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 1", timeout=30_000)
        ids = playground_ids(page)
        assert len(ids) == 1, ids
        pid = ids[0]
        toy = check_against_library(build_in_page(page, pid))         # the paper's toy, as the page starts
        assert toy.n_blocks == 15
        page.click(f"button[id='{pid}-play']")                          # play from block 0: the label walks through the blocks
        page.wait_for_function("(pid) => /after block [2-9] of 15/.test(document.getElementById(pid + '-label').textContent)", arg=pid, timeout=20_000)
        page.click(f"button[id='{pid}-edit']")
        page.select_option(f"select[id='{pid}-seq']", "3")              # a fourth sequence, placed with the mouse
        click_at(page, pid, -1.5, -1.2)
        click_at(page, pid, 1.1, -1.6)
        page.select_option(f"select[id='{pid}-kind']", "target")
        click_at(page, pid, 1.3, 1.7)
        click_at(page, pid, -1.8, 0.4)
        n = page.evaluate("(pid) => window.stConstruct.specs[pid].items.length", pid)
        assert n == 16 + 4, n
        # drag the toy's token a (shared by sequences 0 and 1: two shapes, one on the other) with the mouse
        page.evaluate("(pid) => document.getElementById(pid).scrollIntoView({block: 'center', behavior: 'instant'})", pid)
        x, y = page.evaluate("""(pid) => { const r = document.getElementById(pid).querySelector('.shapelayer path[data-index="0"]').getBoundingClientRect();
                                           return [r.x + r.width / 2, r.y + r.height / 2]; }""", pid)
        before = page.evaluate("(pid) => JSON.stringify(window.stConstruct.specs[pid].items)", pid)
        page.mouse.move(x, y); page.mouse.down()
        for i in range(1, 7): page.mouse.move(x + 40 * i / 6, y + 30 * i / 6)
        page.mouse.up()
        page.wait_for_function("([pid, b]) => JSON.stringify(window.stConstruct.specs[pid].items) !== b", arg=[pid, before], timeout=10_000)
        page.wait_for_timeout(300)
        ans = build_in_page(page, pid)
        T = check_against_library(ans)
        assert T.n_blocks == 15 + 2 * 2 + 2, ans["text"]
        assert ans["dataset"]["slots"] == [0, 1, 2, 3]
        flat = [p for x in ans["dataset"]["X"] for p in x]
        assert sum(p == [0.2, 0.9] for p in flat) == 1, ans["dataset"]["X"]   # the drag moved one of the two shapes on the toy's shared a
        page.click(f"button[id='{pid}-edit']")                          # a dataset the theorem refuses: said in the page
        page.select_option(f"select[id='{pid}-seq']", "1")
        page.select_option(f"select[id='{pid}-kind']", "target")
        for xy in ((0.5, 0.5), (0.6, 0.5), (0.7, 0.5)): click_at(page, pid, *xy)
        bad = build_in_page(page, pid)
        assert bad["state"] == "error" and "sequence 1: m_j must satisfy" in bad["text"], bad["text"]
        assert not errors and not console, (errors, console)
        assert not outside, outside
        page.context.close()
