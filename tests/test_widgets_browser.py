"""The widgets chapter live in JupyterLab (headless Chromium): run all cells, drag a knot and move a slider of the spline
editor and see the curve and the live-effect panel change, press Play on the collapse player and see the frame
advance; no request leaves the machine. Also the offline (static-site) editor: drag a knot in a plain HTML page."""
import contextlib, json, os, secrets, shutil, subprocess, sys, tempfile, time, urllib.request
from pathlib import Path

import pytest

from browser import require_browser, launch, serve, free_port, open_page

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "nbs" / "30_widgets.ipynb"

LAB_CONFIG = {"LabApp": {"news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                         "extension_manager": "readonly", "expose_app_in_browser": True},
              "ServerApp": {"open_browser": False, "ip": "127.0.0.1", "allow_root": True},
              "LanguageServerManager": {"autodetect": False}}
# user settings: no news, no update checks (the server side is off too, via LAB_CONFIG), no windowed notebook
# (cells outside the viewport would not be drawn, and plotly needs a drawn node)
LAB_SETTINGS = {"@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
                "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none", "recordTiming": True}}


@contextlib.contextmanager
def jupyterlab(notebook:Path, timeout:float=90):
    "JupyterLab on 127.0.0.1 serving a temporary copy of `notebook`, with throw-away config; yields the notebook's URL."
    with tempfile.TemporaryDirectory(prefix="lab-") as tmp:
        tmp = Path(tmp)
        work, cfg, runtime, settings = (tmp / d for d in ("work", "config", "runtime", "settings"))
        for d in (work, cfg, runtime, settings): d.mkdir()
        shutil.copy2(notebook, work / notebook.name)      # JupyterLab may autosave: never into the repository
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


def test_widgets_chapter_live_in_jupyterlab(browser):
    with jupyterlab(CHAPTER) as url:
        page, outside, errors = _open(browser, url)
        page.wait_for_function(f"({JS_NB})() && ({JS_NB})().sessionContext.session && "
                               f"({JS_NB})().sessionContext.session.kernel && "
                               f"({JS_NB})().sessionContext.kernelDisplayStatus === 'idle'", timeout=90_000, polling=250)
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        # every code cell has run (an execution count) and the kernel is idle again, or a cell failed (run-all stops)
        page.wait_for_function(f"""() => {{ const w = ({JS_NB})(), cells = w.content.widgets.filter(c => c.model.type === 'code');
            const failed = cells.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'));
            return failed || (cells.every(c => c.model.executionCount) && w.sessionContext.kernelDisplayStatus === 'idle'); }}""",
                               timeout=180_000, polling=500)
        failed = page.evaluate(f"""() => ({JS_NB})().content.widgets.filter(c => c.model.type === 'code')
            .flatMap(c => c.model.outputs.toJSON().filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue))""")
        assert not failed, f"cells failed in JupyterLab: {failed}"

        # the spline editor with the live-effect panel: two plotly figures (spline, effect) drawn by the widget
        ed = "fit_editor = SplineEditor"
        page.wait_for_function(f"() => {_plots(page, ed)}.length >= 2 && {_plots(page, ed)}.every(g => g._fullData)", timeout=60_000)
        k = 16
        for attempt in range(3):
            curve0, effect0 = _y(page, ed, 0, 1, k), _y(page, ed, 1, 1)
            _drag_up(page, f"{_plots(page, ed)}[0]", k)
            try:
                page.wait_for_function(f"() => {_plots(page, ed)}[0]._fullData[1].y[{k}] > {curve0} + 0.1", timeout=20_000)
                page.wait_for_function(f"() => JSON.stringify(Array.from({_plots(page, ed)}[1]._fullData[1].y)) !== "
                                       f"{json.dumps(json.dumps(effect0))}", timeout=20_000)
                break
            except Exception:
                # anywidget gives a new widget 2 s to start; on a loaded machine a FigureWidget can miss that and stay
                # deaf to Python (console: "[anywidget] Failed to initialize model."). Run the cell again: new widgets.
                if attempt == 2: raise
                _rerun_cell(page, ed)
        effect1 = _y(page, ed, 1, 1)
        assert effect1 != effect0
        # the knot circle was snapped back onto its knot's x
        page.wait_for_function(f"() => {{ const g = {_plots(page, ed)}[0]; return Math.abs(g.layout.shapes[{k}].xanchor - g._fullData[1].x[{k}]) < 1e-9; }}",
                               timeout=30_000)

        # the value slider: focus its handle and press ArrowRight; the selected knot (the dragged one) moves up
        curve1 = _y(page, ed, 0, 1, k)
        cell = f"({JS_CELL})({json.dumps(ed)})"
        page.evaluate(f"() => {cell}.querySelectorAll('.widget-hslider .noUi-handle')[1].focus()")
        for _ in range(30): page.keyboard.press("ArrowRight"); page.wait_for_timeout(40)
        page.wait_for_function(f"() => {_plots(page, ed)}[0]._fullData[1].y[{k}] > {curve1} + 0.03", timeout=30_000)
        page.wait_for_function(f"() => JSON.stringify(Array.from({_plots(page, ed)}[1]._fullData[1].y)) !== {json.dumps(json.dumps(effect1))}",
                               timeout=30_000)

        # the collapse player: press Play, the layer slider moves to a later frame
        pl = "player = CollapsePlayer"
        page.wait_for_function(f"() => {_plots(page, pl)}.length >= 1 && {_plots(page, pl)}[0]._fullLayout.sliders", timeout=60_000)
        assert page.evaluate(f"() => {_plots(page, pl)}[0]._fullLayout.sliders[0].active") == 0
        page.evaluate(f"() => {_plots(page, pl)}[0].querySelector('.updatemenu-button').dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")
        page.wait_for_function(f"() => {_plots(page, pl)}[0]._fullLayout.sliders[0].active >= 2", timeout=30_000)
        title = page.evaluate(f"() => {_plots(page, pl)}[0]._fullLayout.title.text")
        assert "block" in title, title

        assert not outside, f"requests that would have left the machine: {outside}"
        page.context.close()


def test_static_editor_drags_offline(browser, tmp_path):
    "The offline editor (what the site shows): drag a knot in a page with only plotly.min.js; the curve follows."
    import plotly
    from spline_transformers.splines import LinearSpline
    from spline_transformers.widgets import SplineEditor
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


def test_chapter_outputs_work_offline(browser, tmp_path):
    "The chapter as the site shows it: execute it (no frontend), put every text/html output in one page with a local"
    " plotly.js; every figure draws, no page errors, nothing leaves the machine, Play advances the collapse animation."
    import plotly
    import nbdev.test as nbt
    nb = tmp_path / CHAPTER.name
    shutil.copy2(CHAPTER, nb)
    ok, _ = nbt.test_nb(nb, skip_flags=["slow", "gpu"], basepath=str(ROOT), save=True)
    assert ok, "the chapter failed to execute"
    cells = json.loads(nb.read_text())["cells"]
    html = [o["data"]["text/html"] for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])
            if "text/html" in o.get("data", {})]
    html = ["".join(h) if isinstance(h, list) else h for h in html]
    assert any("spline-editor-static" in h for h in html) and any("Plotly.addFrames" in h for h in html)
    shutil.copy2(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", tmp_path / "plotly.min.js")
    (tmp_path / "index.html").write_text('<!doctype html><html><head><meta charset="utf-8"><script src="plotly.min.js"></script>'
                                          "</head><body>" + "\n".join(f"<div class='out'>{h}</div>" for h in html) + "</body></html>")
    n_plots = sum(h.count("Plotly.newPlot(") for h in html)
    with serve(tmp_path) as base:
        page, outside, errors = _open(browser, f"{base}/index.html")
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n_plots}", timeout=60_000)
        anim = "[...document.querySelectorAll('.js-plotly-plot')].find(g => g._transitionData && g._transitionData._frames.length > 1)"
        assert page.evaluate(f"() => {anim}._fullLayout.sliders[0].active") == 0
        page.evaluate(f"() => {{ const b = {anim}.querySelector('.updatemenu-button'); b.scrollIntoView();"
                      " b.dispatchEvent(new MouseEvent('click', {bubbles: true})); }")
        page.wait_for_function(f"() => {anim}._fullLayout.sliders[0].active >= 2", timeout=30_000)
        assert not errors, errors
        assert not outside, outside
        page.context.close()
