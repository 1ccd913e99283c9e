"""The editor chapter (10a) and the widgets chapter (30) live in JupyterLab (headless Chromium), used as a reader would:
Run All, press buttons and drag knots with the mouse, move a slider, pick from a drop-down, reload the page, resize the
notebook area, Play and Pause the collapse player, Run All again. After each action every figure (curve points, knot circles, marker, titles,
effect panel) must show what the kernel holds; no edit may appear that the cells did not make; no figure may change
height; no console error, kernel traceback or warning; no request leaves the machine. Chapter 8 runs in JupyterLab to its
end, its demo's Phase II arms in two processes. Also the offline (static-site) editor: drag a knot in a plain HTML page."""
import contextlib, json, os, secrets, shutil, subprocess, sys, tempfile, time, urllib.request
from pathlib import Path

from conftest import build_docs

import pytest

from browser import require_browser, launch, serve, free_port, open_page, console_errors

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
EDITOR_CHAPTER = build_docs.chapter("10a_editor")   # the spline editors
WIDGETS_CHAPTER = build_docs.chapter("30_widgets")  # the collapse player and the training monitors
TWO_PHASE_CHAPTER = build_docs.chapter("08_two_phase")   # its `#| slow` demo cell runs the Phase II arms in two processes

LAB_CONFIG = {"LabApp": {"news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                         "extension_manager": "readonly", "expose_app_in_browser": True},
              "ServerApp": {"open_browser": False, "ip": "127.0.0.1", "allow_root": True},
              "LanguageServerManager": {"autodetect": False}}
# user settings: no news, no update checks (the server side is off too, via LAB_CONFIG), no windowed notebook
# (cells outside the viewport would not be drawn, and plotly needs a drawn node)
LAB_SETTINGS = {"@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
                "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none", "recordTiming": True}}


@contextlib.contextmanager
def jupyterlab(notebook:Path, timeout:float=90, edits:dict=None):
    """JupyterLab on 127.0.0.1 serving a temporary copy of `notebook` (with each code `edits` key replaced by its value, once),
    with throw-away config; yields the notebook's URL."""
    with tempfile.TemporaryDirectory(prefix="lab-") as tmp:
        tmp = Path(tmp)
        work, cfg, runtime, settings = (tmp / d for d in ("work", "config", "runtime", "settings"))
        for d in (work, cfg, runtime, settings): d.mkdir()
        nb = json.loads(notebook.read_text())   # a copy: JupyterLab may autosave, never into the repository
        for old, new in (edits or {}).items():
            found = [c for c in nb["cells"] if c["cell_type"] == "code" and old in "".join(c["source"])]
            assert len(found) == 1, f"{notebook.name}: {len(found)} code cells contain {old!r}"
            found[0]["source"] = "".join(found[0]["source"]).replace(old, new)
        (work / notebook.name).write_text(json.dumps(nb, indent=1))
        (cfg / "jupyter_server_config.json").write_text(json.dumps(LAB_CONFIG))
        for plugin, values in LAB_SETTINGS.items():
            f = settings / f"{plugin}.jupyterlab-settings"; f.parent.mkdir(parents=True, exist_ok=True); f.write_text(json.dumps(values))
        token, port = secrets.token_hex(16), free_port()
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(cfg), JUPYTER_RUNTIME_DIR=str(runtime), IPYTHONDIR=str(tmp / "ipython"),
                   PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                   JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        log = open(tmp / "lab.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", f"--port={port}", "--no-browser", "--ip=127.0.0.1",
                                 f"--IdentityProvider.token={token}", "--allow-root", "--LabApp.expose_app_in_browser=True",
                                 f"--ServerApp.root_dir={work}"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            base, t0 = f"http://127.0.0.1:{port}", time.time()
            while True:
                if proc.poll() is not None: raise RuntimeError(f"JupyterLab exited: {(tmp / 'lab.log').read_text()[-3000:]}")
                try:
                    urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2); break
                except OSError:
                    if time.time() - t0 > timeout: raise TimeoutError(f"JupyterLab did not start: {(tmp / 'lab.log').read_text()[-3000:]}")
                    time.sleep(0.5)
            yield f"{base}/lab/tree/{notebook.name}?token={token}"
        finally:
            proc.terminate()
            try: proc.wait(20)
            except subprocess.TimeoutExpired: proc.kill(); proc.wait()
            log.close()


def _open(browser, url):
    "A page at `url` that records page errors and aborts (and records) every request that would leave the machine."
    page, errors, outside = open_page(browser, url, wait_until="domcontentloaded", viewport={"width": 1400, "height": 1000})
    return page, outside, errors


# JavaScript helpers evaluated in the page: the notebook panel, the output node of the cell whose source starts with
# `prefix` (the cell whose source contains it), and the plotly graph divs inside it.
JS_NB = "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget; return w && w.content && w.sessionContext ? w : null; }"
JS_CELL = """(prefix) => { const w = window.jupyterapp.shell.currentWidget;
  const c = w.content.widgets.find(c => c.model.type === 'code' && c.model.sharedModel.getSource().includes(prefix));
  return c ? c.node : null; }"""


def _plots(page, prefix):
    "JS expression: the plotly graph divs in the output of the cell starting with `prefix`."
    return f"[...({JS_CELL})({json.dumps(prefix)}).querySelectorAll('.jp-OutputArea .js-plotly-plot')]"


def _y(page, prefix, plot, trace, i=None):
    sel = f"{_plots(page, prefix)}[{plot}]._fullData[{trace}].y"
    return page.evaluate(f"() => Array.from({sel})" + (f"[{i}]" if i is not None else ""))


def _drag_up(page, gd, k, dy=60):
    "Drag knot circle `k` of the graph div `gd` (a JS expression) up by `dy` pixels with the mouse."
    knot = page.evaluate(f"""() => {{ const p = {gd}.querySelector('.shapelayer path[data-index="{k}"]');
                                      p.scrollIntoView({{block: 'center'}}); const r = p.getBoundingClientRect();
                                      return [r.x + r.width / 2, r.y + r.height / 2]; }}""")
    page.wait_for_timeout(300)
    knot = page.evaluate(f"""() => {{ const r = {gd}.querySelector('.shapelayer path[data-index="{k}"]').getBoundingClientRect();
                                      return [r.x + r.width / 2, r.y + r.height / 2]; }}""")
    page.mouse.move(*knot); page.mouse.down()
    for step in range(1, 6): page.mouse.move(knot[0], knot[1] - dy * step / 5)
    page.mouse.up()


def _rerun_cell(page, prefix):
    "Run the cell containing `prefix` again and wait for its figures."
    page.evaluate(f"""() => {{ const w = ({JS_NB})(); const i = w.content.widgets.findIndex(c => c.model.type === 'code' &&
                                 c.model.sharedModel.getSource().includes({json.dumps(prefix)}));
                             w.content.activeCellIndex = i; return window.jupyterapp.commands.execute('notebook:run-cell'); }}""")
    page.wait_for_timeout(1000)
    page.wait_for_function(f"() => ({JS_NB})().sessionContext.kernelDisplayStatus === 'idle' && {_plots(page, prefix)}.length >= 2 "
                           f"&& {_plots(page, prefix)}.every(g => g._fullData && g._fullData.length >= 2)", timeout=60_000)
    page.wait_for_timeout(2500)


@pytest.fixture(scope="module")
def browser():
    require_browser()
    with launch() as b: yield b


CONSOLE = []                               # console errors so far (reported with a disagreement)
SHOTS = os.environ.get("WIDGETS_SHOTS")    # a folder: save screenshots of each check there (for a reviewer)


def _shot(page, name, prefix=None, plot=None):
    if not SHOTS: return
    if prefix is not None:
        page.evaluate(f"() => {{ const g = {_plots(page, prefix)}; const n = g.length ? g[{plot or 0}] : ({JS_CELL})({json.dumps(prefix)});"
                      " n.scrollIntoView({block: 'center'}); }")
        page.wait_for_timeout(400)
    Path(SHOTS).mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))


def _kernel(page, code):
    "Run `code` in the notebook's kernel (not in a cell); returns what it printed (an error: its name and value)."
    return page.evaluate("""(code) => new Promise((resolve, reject) => {
        const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
        const f = k.requestExecute({code, silent: false, store_history: false}); let out = '';
        f.onIOPub = m => { if (m.header.msg_type === 'stream' && m.content.name === 'stdout') out += m.content.text;
                           if (m.header.msg_type === 'error') out += 'ERROR ' + m.content.ename + ': ' + m.content.evalue; };
        f.done.then(() => resolve(out), reject); })""", code)


def _kjson(page, expr):
    out = _kernel(page, f"import json as _json; print(_json.dumps({expr}))")
    assert not out.startswith("ERROR"), out
    return json.loads(out)


def _watch_kernel_errors(page):
    "Collect every traceback and stderr text the kernel sends (what the Log Console and pink boxes show) in the page."
    page.evaluate("""() => { window.__kernelErrors = window.__kernelErrors || [];
        const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
        k.iopubMessage.connect((_, m) => {
            if (m.header.msg_type === 'error') window.__kernelErrors.push(m.content.ename + ': ' + m.content.evalue);
            if (m.header.msg_type === 'stream' && m.content.name === 'stderr') window.__kernelErrors.push(m.content.text.slice(0, 600));
        }); }""")


def _kernel_errors(page): return page.evaluate("() => window.__kernelErrors || []")


def _wait_kernel(page):
    page.wait_for_function(f"({JS_NB})() && ({JS_NB})().sessionContext.session && ({JS_NB})().sessionContext.session.kernel && "
                           f"({JS_NB})().sessionContext.kernelDisplayStatus === 'idle'", timeout=120_000, polling=250)


def _run_all(page, timeout=300):
    "Run All; wait until every code cell has run and the kernel is idle (at most `timeout` seconds); no cell may fail."
    page.evaluate(f"() => ({JS_NB})().content.widgets.forEach(c => c.model.type === 'code' && (c.model.executionCount = null))")
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(f"""() => {{ const w = ({JS_NB})(), cells = w.content.widgets.filter(c => c.model.type === 'code');
        const failed = cells.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'));
        return failed || (cells.every(c => c.model.executionCount) && w.sessionContext.kernelDisplayStatus === 'idle'); }}""",
                           timeout=timeout * 1000, polling=500)
    failed = page.evaluate(f"""() => ({JS_NB})().content.widgets.filter(c => c.model.type === 'code')
        .flatMap(c => c.model.outputs.toJSON().filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue))""")
    assert not failed, f"cells failed in JupyterLab: {failed}"


def _click(page, prefix, text):
    "Click, with the mouse, the button labelled `text` in the output of the cell containing `prefix`."
    cell = f"({JS_CELL})({json.dumps(prefix)})"
    page.evaluate(f"() => [...{cell}.querySelectorAll('button')].find(b => b.textContent.trim() === {json.dumps(text)})"
                  ".scrollIntoView({block: 'center'})")
    page.wait_for_timeout(300)
    xy = page.evaluate(f"() => {{ const r = [...{cell}.querySelectorAll('button')].find(b => b.textContent.trim() === "
                       f"{json.dumps(text)}).getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }}")
    page.mouse.click(*xy)


ED, FIT, MODEL, PLAYER = "ed = SplineEditor(spline)", "fit_editor = SplineEditor", "model_editor = SplineEditor", "player = CollapsePlayer"
ZOO = "zoo_editor = SplineEditor"  # the zoo's learned spline (load_learned)
MONITORS = ("TrainingMonitor(total=600", "TrainingMonitor(total=30")
# each editor: (its cell, the kernel expression of the editor)
EDITORS = ((ED, "ed"), (FIT, "fit_editor"), (MODEL, "model_editor"), (ZOO, "zoo_editor"))


def _editor_matches_kernel(page, prefix, name):
    "JS-side check that the editor figure (curve points, knot circles, selected-knot marker, title) and its effect panel"
    " (data and title) show what the kernel holds; returns a list of disagreements (empty when all agree)."
    k = _kjson(page, f"""dict(x={name}.ref.knots.tolist(), y={name}.values.tolist(), sel={name}.knot_slider.value, name={name}.name,
        title={name}.fig.layout.title.text, picker={name}.picker.value,
        effect=None if {name}.effect_fig is None else dict(title={name}.effect_fig.layout.title.text,
                       y=[list(t.y) if t.y is not None else None for t in {name}.effect_fig.data]))""")
    return page.evaluate(f"""(k) => {{ const g = {_plots(page, prefix)}, bad = [];
        if (!g.length || !g[0]._fullData) return ['no figure drawn'];
        const d = g[0]._fullData, close = (a, b) => Math.abs(a - b) < 1e-5;
        const y = Array.from(d[1].y);
        if (y.length !== k.y.length || y.some((v, i) => !close(v, k.y[i]))) bad.push('curve ' + JSON.stringify(y.slice(0, 40)) + ' != kernel ' + JSON.stringify(k.y.slice(0, 40)));
        const rx = Array.from(d[0].x);            // the dashed reference spans the knots
        if (!rx.length || !close(rx[0], k.x[0]) || !close(rx[rx.length - 1], k.x[k.x.length - 1])) bad.push('reference curve spans ' + rx[0] + '..' + rx[rx.length - 1]);
        const sh = g[0].layout.shapes.slice(0, k.y.length);
        if (sh.some((s, i) => !close(s.yanchor, k.y[i]) || !close(s.xanchor, k.x[i]))) bad.push('knot circles off the curve');
        if (!close(d[2].x[0], k.x[k.sel]) || !close(d[2].y[0], k.y[k.sel])) bad.push('selected-knot marker ' + d[2].x[0] + ',' + d[2].y[0] + ' not on knot ' + k.sel);
        const title = g[0]._fullLayout.title.text;
        if (title !== k.title || !title.startsWith(k.name + ':')) bad.push('title ' + title + ' != kernel ' + k.title);
        const sel = ({JS_CELL})({json.dumps(prefix)}).querySelector('.widget-dropdown select');
        if (sel && sel.value !== k.picker) bad.push('drop-down ' + sel.value + ' != kernel ' + k.picker);
        if (k.effect) {{
            if (g.length < 2 || !g[1]._fullData) return bad.concat(['no effect panel drawn']);
            if (g[1]._fullLayout.title.text !== k.effect.title) bad.push('effect title ' + g[1]._fullLayout.title.text + ' != kernel ' + k.effect.title);
            k.effect.y.forEach((ky, t) => {{ if (ky === null) return; const py = Array.from(g[1]._fullData[t].y);
                if (py.length !== ky.length || py.some((v, i) => !close(v, ky[i]))) bad.push('effect trace ' + t + ' differs from the kernel'); }});
        }}
        return bad; }}""", k)


def _wait_agree(page, prefix, name, timeout=30):
    t0, bad = time.time(), None
    while time.time() - t0 < timeout:
        bad = _editor_matches_kernel(page, prefix, name)
        if not bad: return
        page.wait_for_timeout(500)
    raise AssertionError(f"{name}: the page disagrees with the kernel: {bad}; console errors: {CONSOLE[-5:]}")


FIGURE_CELLS = (ED, FIT, MODEL, ZOO, PLAYER, "AnimationOutput(anim3)", "monitor.figure()", "tm.figure()") + MONITORS


def _check_after_run_all(page, editors=(), player=False):
    "The editors hold exactly what the cells set (no undo step nobody made), the status lines show the instructions, the"
    " player's animation is drawn once (inside the player), and every figure agrees with the kernel."
    page.wait_for_timeout(3000)                          # late echoes from the browser have had time to arrive
    if editors:
        names = "(" + ", ".join(name for _, name in editors) + ",)"
        hist = _kjson(page, f"[[h[2] for h in e.history] for e in {names}]")
        if hist != [[]] * len(editors):                 # what the browser sent, and what the editors had sent it
            seen = _kjson(page, f"[dict(slider=[e.value_slider.value, e.value_slider.min, e.value_slider.max], "
                                f"sent=e._sent[-6:]) for e in {names}]")
            raise AssertionError(f"edits nobody made: {hist}; the editors' sliders: {seen}")
        assert _kjson(page, f"[bool(torch.equal(e.values.detach(), e.learned[e.name])) for e in {names}]") == [True] * len(editors)
    for prefix, name in editors:
        status = page.evaluate(f"() => [...({JS_CELL})({json.dumps(prefix)}).querySelectorAll('.widget-html')].map(e => e.textContent)"
                               ".find(t => t.includes('undo steps'))")
        assert status and "drag a knot" in status and "undo steps: 0" in status, f"{name} status: {status}"
        _wait_agree(page, prefix, name)
    n_anim = page.evaluate(f"() => ({JS_NB})().content.widgets.filter(c => c.model.type === 'code').map(c => "
                           "c.node.querySelectorAll('.jp-OutputArea .js-plotly-plot').length)")
    if player: assert page.evaluate(f"() => {_plots(page, PLAYER)}.length") == 1
    srcs = page.evaluate(f"() => ({JS_NB})().content.widgets.filter(c => c.model.type === 'code').map(c => c.model.sharedModel.getSource())")
    stray = [s.splitlines()[0] for s, n in zip(srcs, n_anim) if n and not any(p in s for p in FIGURE_CELLS)]
    assert not stray, f"figures under cells that show none: {stray}"


def _resize_keeps_heights(page, focus=None, min_height=250):
    "(5) resize the notebook area with the mouse, as a reader does: the Log Console opened from the View menu (below the"
    " notebook), the sidebar hidden and shown again (its tab clicked), the console closed. After each step every figure"
    " keeps its height, and no figure is drawn in no room (plotly logs 'Infinity' errors). `focus`: a cell to scroll to first;"
    " `min_height`: the least height (px) a figure of the chapter is drawn with."
    if focus is not None:
        page.evaluate(f"() => ({JS_CELL})({json.dumps(focus)}).scrollIntoView({{block: 'center'}})")
        page.wait_for_timeout(500)
    heights, n_console = _plot_heights(page), len(CONSOLE)
    assert min(heights) >= min_height, heights
    tab = ".jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id='filebrowser']"
    def menu(item):
        page.locator(".lm-MenuBar-itemLabel", has_text="View").click()
        page.locator(".lm-Menu-itemLabel", has_text=item).click()
    steps = (("the Log Console opened", lambda: menu("Show Log Console")),
             ("the sidebar hidden", lambda: page.locator(tab).click()),
             ("the sidebar shown", lambda: page.locator(tab).click()),
             ("the Log Console closed", lambda: page.locator("#jp-down-stack .lm-TabBar-tabCloseIcon").click()))
    for what, act in steps:
        act()
        page.wait_for_timeout(1500)
        now = _plot_heights(page)
        assert now == heights, f"after {what}, heights changed: {heights} -> {now}"
        if what == "the Log Console opened": widths = _plot_widths(page)
        if what == "the sidebar hidden":                 # the figures still follow the notebook's width
            wider = _plot_widths(page)
            assert all(b > a + 100 for a, b in zip(widths, wider)), f"the sidebar hidden, widths {widths} -> {wider}"
    assert page.evaluate("() => [...window.jupyterapp.shell.widgets('down')].length") == 0, "the Log Console is still open"
    drawn_in_no_room = [m for m in CONSOLE[n_console:] if "Infinity" in m]
    assert not drawn_in_no_room, f"figures drawn in no room on a resize: {drawn_in_no_room[:3]} ({len(drawn_in_no_room)} errors)"


def _nothing_went_wrong(page, errors, console, outside):
    "(3) no kernel traceback or warning anywhere (Log Console, pink boxes), no console error, nothing left the machine."
    assert not _kernel_errors(page), f"the kernel reported: {_kernel_errors(page)}"
    assert not errors, f"page errors: {errors}"
    assert not console, f"console errors: {console}"
    assert not outside, f"requests that would have left the machine: {outside}"


def _open_lab_page(browser, url):
    "The notebook at `url` in JupyterLab, its kernel idle and watched: (page, requests that left, page errors, console errors)."
    page, outside, errors = _open(browser, url)
    console = console_errors(page)
    CONSOLE[:] = []; page.on("console", lambda m: CONSOLE.append(m.text) if m.type == "error" else None)
    _wait_kernel(page)
    _watch_kernel_errors(page)
    return page, outside, errors, console


def _plot_heights(page):
    return page.evaluate("() => [...document.querySelectorAll('.jp-OutputArea .js-plotly-plot')].map(g => Math.round(g.getBoundingClientRect().height))")


def _plot_widths(page):
    return page.evaluate("() => [...document.querySelectorAll('.jp-OutputArea .js-plotly-plot')].map(g => Math.round(g.getBoundingClientRect().width))")


def test_editor_chapter_live_in_jupyterlab(browser, quiet_cores):
    with jupyterlab(EDITOR_CHAPTER) as url:
        page, outside, errors, console = _open_lab_page(browser, url)
        _run_all(page)
        _check_after_run_all(page, EDITORS)                                      # issue 18 (4)
        _shot(page, "after_runall_fit_editor", FIT)

        # (1) a button, pressed with the mouse: the curve and the effect panel (data and title) follow the model
        _click(page, FIT, "identity")
        page.wait_for_function(f"() => {_plots(page, FIT)}[1]._fullLayout.title.text.includes('mse') && "
                               f"!{_plots(page, FIT)}[1]._fullLayout.title.text.includes('mse 0.000')", timeout=30_000)
        _wait_agree(page, FIT, "fit_editor")
        assert f"mse {_kjson(page, 'fit_mse()'):.4f}" in page.evaluate(f"() => {_plots(page, FIT)}[1]._fullLayout.title.text")
        _shot(page, "item1_effect_title_after_identity", FIT, 1)
        _click(page, FIT, "undo")
        _wait_agree(page, FIT, "fit_editor")

        # a knot dragged with the mouse: the curve, the circle (snapped back onto its x), the marker and the panel follow
        k = 16
        curve0 = _y(page, FIT, 0, 1, k)
        _drag_up(page, f"{_plots(page, FIT)}[0]", k)
        page.wait_for_function(f"() => {_plots(page, FIT)}[0]._fullData[1].y[{k}] > {curve0} + 0.1", timeout=30_000)
        _wait_agree(page, FIT, "fit_editor")
        assert _kjson(page, "fit_editor.knot_slider.value") == k

        # the value slider: focus its handle and press ArrowRight; the selected knot (the dragged one) moves up
        curve1 = _y(page, FIT, 0, 1, k)
        cell = f"({JS_CELL})({json.dumps(FIT)})"
        page.evaluate(f"() => {cell}.querySelectorAll('.widget-hslider .noUi-handle')[1].focus()")
        for _ in range(30): page.keyboard.press("ArrowRight"); page.wait_for_timeout(40)
        page.wait_for_function(f"() => {_plots(page, FIT)}[0]._fullData[1].y[{k}] > {curve1} + 0.01", timeout=30_000)
        _wait_agree(page, FIT, "fit_editor")

        # the model editor: pick the attention kernel in the drop-down; title, curve and drop-down agree with the kernel
        sel = page.evaluate_handle(f"() => ({JS_CELL})({json.dumps(MODEL)}).querySelector('.widget-dropdown select')").as_element()
        sel.scroll_into_view_if_needed(); sel.select_option("attn.0")
        page.wait_for_function(f"() => {_plots(page, MODEL)}[0]._fullLayout.title.text.startsWith('attn.0')", timeout=30_000)
        _click(page, MODEL, "relu")
        _wait_agree(page, MODEL, "model_editor")
        assert _kjson(page, "model_editor.name") == "attn.0"

        # (2) reload the page with the kernel alive: every figure comes back as the kernel holds it, and still listens
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_timeout(2000)
        page.reload(wait_until="domcontentloaded")
        _wait_kernel(page)
        _watch_kernel_errors(page)
        page.wait_for_function(f"() => {_plots(page, MODEL)}.length >= 2 && {_plots(page, FIT)}.length >= 2", timeout=120_000)
        for prefix, name in EDITORS: _wait_agree(page, prefix, name)
        _shot(page, "item2_fit_editor_after_reload", FIT)
        _shot(page, "item2_model_editor_after_reload", MODEL)
        _click(page, FIT, "undo")                        # after the reload the figures still hear the kernel
        _wait_agree(page, FIT, "fit_editor")
        _click(page, MODEL, "undo")
        _wait_agree(page, MODEL, "model_editor")

        _resize_keeps_heights(page)                                              # (5)

        # (4) Run All again, after the edits: no edit appears that the cells did not make (issue 18: "run Run All twice")
        _run_all(page)
        _check_after_run_all(page, EDITORS)
        _shot(page, "item4_status_after_second_runall", ED)

        _nothing_went_wrong(page, errors, console, outside)                      # (3)
        page.context.close()


def test_widgets_chapter_live_in_jupyterlab(browser, quiet_cores):
    with jupyterlab(WIDGETS_CHAPTER) as url:
        page, outside, errors, console = _open_lab_page(browser, url)
        _run_all(page)
        _check_after_run_all(page, player=True)
        _resize_keeps_heights(page, focus="AnimationOutput(anim3)")             # (5) the figures as first drawn

        # (2) reload the page with the kernel alive: the monitors come back with every point the kernel holds
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_timeout(2000)
        page.reload(wait_until="domcontentloaded")
        _wait_kernel(page)
        _watch_kernel_errors(page)
        page.wait_for_function(f"() => {_plots(page, MONITORS[0])}.length >= 1 && {_plots(page, MONITORS[1])}.length >= 1 && "
                               f"{_plots(page, PLAYER)}.length >= 1", timeout=120_000)
        for prefix, name in zip(MONITORS, ("monitor", "tm")):
            n = _kjson(page, f"[len([r for r in {name}.history if m in r]) for m in {name}.metrics()]")
            drawn = page.evaluate(f"() => {_plots(page, prefix)}.length && {_plots(page, prefix)}[0]._fullData ? "
                                  f"{_plots(page, prefix)}[0]._fullData.map(t => t.x.length) : null")
            assert drawn == n, f"{name} after a reload draws {drawn} points per curve, the kernel has {n}"
        _shot(page, "item2_monitor_after_reload", MONITORS[0])

        _resize_keeps_heights(page)                                              # (5)
        _shot(page, "item5_animation_after_resize", "AnimationOutput(anim3)")

        # the collapse player: Play moves the layer slider on, Pause stops it (no uncaught error)
        pl = f"{_plots(page, PLAYER)}[0]"
        page.evaluate(f"() => {pl}.scrollIntoView({{block: 'center'}})")
        assert page.evaluate(f"() => {pl}._fullLayout.sliders[0].active") == 0
        page.evaluate(f"() => {pl}.querySelectorAll('.updatemenu-button')[0].dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
        page.wait_for_function(f"() => {pl}._fullLayout.sliders[0].active >= 2", timeout=30_000)
        page.evaluate(f"() => {pl}.querySelectorAll('.updatemenu-button')[1].dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
        page.wait_for_timeout(2000)
        title = page.evaluate(f"() => {pl}._fullLayout.title.text")
        assert "seed 0" in title and "block" in title, title

        # (4) Run All again, after Play and Pause: one animation per player, no stray figure (issue 18: "run Run All twice")
        _run_all(page)
        _check_after_run_all(page, player=True)
        _nothing_went_wrong(page, errors, console, outside)                      # (3)
        page.context.close()


DEMO_CELL = 'demo = run_demo(demo_config("cpu"), log=print)'
QUICK_DEMO_CELL = 'demo = run_demo(quick_demo_config(), log=print)'   # the same pipeline in seconds (`demo --quick`'s sizes)
# Phase II at 250 steps, where the median test accuracy of either arm is past 0.2 (the chapter's own test checks 0.9 at 700),
# and the `#| slow` transfer cell's four runs at 100 steps: this test is about the kernel and the page, not about learning.
SHORT_RUNS = {"cfg2 = TrainConfig(steps=700": "cfg2 = TrainConfig(steps=250", "acc(r).iloc[-1] >= 0.9": "acc(r).iloc[-1] >= 0.1",
              "cfg2, seeds=[0]": "replace(cfg2, steps=100), seeds=[0]"}
GPU_CELL = 'gdemo = run_demo(demo_config("cuda")'


@pytest.mark.timeout(1500)
def test_two_phase_chapter_runs_to_its_end_in_jupyterlab(browser):
    "Chapter 8, all of it, Run All in JupyterLab as a reader runs it: its `#| slow` demo (at `quick_demo_config`'s sizes, as"
    " `demo --quick` runs it: the cpu size would take minutes and exercises nothing more here; Phase II and the `#| slow`"
    " transfer matrix likewise shorter, `SHORT_RUNS`), whose `DemoConfig`"
    " and `run_demo` are the notebook's own (classes of the kernel's __main__, which the arms' processes cannot import: they"
    " once failed to unpickle one) and whose two Phase II arms run in two processes, and its `#| gpu` cell, which on a"
    " machine without CUDA says so instead of failing. Then the Log Console and the sidebar: every figure keeps its height."
    with jupyterlab(TWO_PHASE_CHAPTER, edits={DEMO_CELL: QUICK_DEMO_CELL, **SHORT_RUNS}) as url:
        page, outside, errors, console = _open_lab_page(browser, url)
        t0 = time.time()
        _run_all(page, timeout=840)
        took = time.time() - t0
        stream = lambda cell: "".join(o.get("text", "") for o in _cell_outputs(page, cell, "stream"))
        demo_out, gpu_out = stream(QUICK_DEMO_CELL), stream(GPU_CELL)
        assert "(the arms in two processes)" in demo_out and "(in parallel)" in demo_out, demo_out
        table = _cell_outputs(page, QUICK_DEMO_CELL, "execute_result")
        assert table and "speedup" in table[0]["data"]["text/plain"] and "learned" in table[0]["data"]["text/plain"], table
        assert _kjson(page, "[type(demo.config).__module__, demo.timings['phase2_processes']]") == ["__main__", 2]
        assert _kjson(page, "torch.cuda.is_available()") or "No CUDA device here" in gpu_out, gpu_out
        n_figures = len(_plot_heights(page))
        assert n_figures >= 6, f"{n_figures} figures drawn"   # Phase I loss, splines, Phase II curves, transfer, the demo's two
        _resize_keeps_heights(page, focus=QUICK_DEMO_CELL, min_height=200)   # the transfer heatmap is 200 px
        _nothing_went_wrong(page, errors, console, outside)
        print(f"chapter 8 ran to its end in JupyterLab in {took:.0f} s, {n_figures} figures")
        page.context.close()


def _cell_outputs(page, prefix, kind=None):
    "The outputs (nbformat JSON) of the code cell whose source contains `prefix`, of type `kind` if given."
    outs = page.evaluate(f"""() => ({JS_NB})().content.widgets.find(c => c.model.type === 'code' &&
                                c.model.sharedModel.getSource().includes({json.dumps(prefix)})).model.outputs.toJSON()""")
    return [o for o in outs if kind is None or o["output_type"] == kind]


def test_static_editor_drags_offline(browser, tmp_path):
    "The offline editor (what the site shows): drag a knot in a page with only plotly.min.js; the curve follows."
    import plotly
    from spline_transformers.splines import LinearSpline
    from spline_transformers.editor import SplineEditor
    ed = SplineEditor(LinearSpline(16, -4.0, 4.0, init="gelu"))
    shutil.copy2(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", tmp_path / "plotly.min.js")
    (tmp_path / "index.html").write_text('<!doctype html><html><head><meta charset="utf-8"><script src="plotly.min.js"></script>'
                                          f"</head><body>{ed._repr_mimebundle_()['text/html']}</body></html>")
    with serve(tmp_path) as base:
        page, outside, errors = _open(browser, f"{base}/index.html")
        page.wait_for_function("() => document.querySelector('.js-plotly-plot') && document.querySelector('.js-plotly-plot')._fullData",
                               timeout=30_000)
        k = 10
        y0 = page.evaluate(f"() => document.querySelector('.js-plotly-plot')._fullData[1].y[{k}]")
        knot = page.evaluate(f"""() => {{ const r = document.querySelector('.js-plotly-plot .shapelayer path[data-index="{k}"]').getBoundingClientRect();
                                          return [r.x + r.width / 2, r.y + r.height / 2]; }}""")
        page.mouse.move(*knot); page.mouse.down()
        for step in range(1, 6): page.mouse.move(knot[0] + 3 * step, knot[1] - 15 * step)
        page.mouse.up()
        page.wait_for_function(f"() => document.querySelector('.js-plotly-plot')._fullData[1].y[{k}] > {y0} + 0.1", timeout=10_000)
        page.wait_for_function(f"""() => {{ const g = document.querySelector('.js-plotly-plot');
                                           return Math.abs(g.layout.shapes[{k}].xanchor - g._fullData[1].x[{k}]) < 1e-9; }}""", timeout=10_000)
        page.click("button[id$='-reset']")
        page.wait_for_function(f"() => Math.abs(document.querySelector('.js-plotly-plot')._fullData[1].y[{k}] - {y0}) < 1e-9", timeout=10_000)
        assert not errors, errors
        assert not outside, outside
        page.context.close()


@pytest.mark.parametrize("chapter, shows", [(EDITOR_CHAPTER, "spline-editor-static"), (WIDGETS_CHAPTER, "Plotly.addFrames")],
                         ids=["editor", "widgets"])
def test_chapter_outputs_work_offline(browser, tmp_path, chapter, shows):
    "A chapter as the site shows it: execute it (no frontend), put every text/html output in one page with a local"
    " plotly.js; every figure draws, no page errors, nothing leaves the machine; Play advances the collapse animation."
    import plotly
    import nbdev.test as nbt
    nb = tmp_path / chapter.name
    shutil.copy2(chapter, nb)
    ok, _ = nbt.test_nb(nb, skip_flags=["slow", "gpu"], basepath=str(ROOT), save=True)
    assert ok, "the chapter failed to execute"
    cells = json.loads(nb.read_text())["cells"]
    html = [o["data"]["text/html"] for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])
            if "text/html" in o.get("data", {})]
    html = ["".join(h) if isinstance(h, list) else h for h in html]
    assert any(shows in h for h in html), f"{chapter.name} shows no {shows}"
    shutil.copy2(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", tmp_path / "plotly.min.js")
    (tmp_path / "index.html").write_text('<!doctype html><html><head><meta charset="utf-8"><script src="plotly.min.js"></script>'
                                          "</head><body>" + "\n".join(f"<div class='out'>{h}</div>" for h in html) + "</body></html>")
    n_plots = sum(h.count("Plotly.newPlot(") for h in html)
    with serve(tmp_path) as base:
        page, outside, errors = _open(browser, f"{base}/index.html")
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n_plots}", timeout=60_000)
        anim = "[...document.querySelectorAll('.js-plotly-plot')].find(g => g._transitionData && g._transitionData._frames.length > 1)"
        if shows == "Plotly.addFrames":                  # the widgets chapter: Play moves the collapse animation on
            assert page.evaluate(f"() => {anim}._fullLayout.sliders[0].active") == 0
            page.evaluate(f"() => {{ const b = {anim}.querySelector('.updatemenu-button'); b.scrollIntoView();"
                          " b.dispatchEvent(new MouseEvent('click', {bubbles: true})); }")
            page.wait_for_function(f"() => {anim}._fullLayout.sliders[0].active >= 2", timeout=30_000)
        assert not errors, errors
        assert not outside, outside
        page.context.close()
