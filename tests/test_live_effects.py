"""Issue 28 (1): an editor whose effect the page computes. In Python: the shipped ADD model loads, scores as the
library scores it, refuses what the page cannot run. In headless Chromium, on a plain page with only plotly.min.js
(no kernel, no site build): drag a knot with the mouse and the loss or accuracy the page computes equals the library's
for the spline the page used, within 1e-4; no request leaves 127.0.0.1, no console error. The same check on the built
site is `test_docs_site.py::test_live_editors_answer_on_the_site`."""
import json, shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from spline_transformers.splines import LinearSpline
from spline_transformers.editor import (SplineEditor, SplineNet, FitEffect, TaskEffect, load_live_model, save_live_model,
                                        site_files, live_dir)


def test_shipped_model_loads_and_scores():
    eff = TaskEffect.shipped("add")
    assert eff.src == "live/add.safetensors" and (live_dir() / "add.safetensors").stat().st_size < 500_000
    assert eff() == {"test accuracy": 1.0, "test loss": pytest.approx(eff.task.evaluate(eff.model, "test", 256)["loss"], abs=0)}
    assert list(site_files()) == ["live/add.safetensors"]
    assert eff.model.nonlinearities.frozen and not eff.model.training


def test_live_model_round_trip_and_refusals(tmp_path):
    eff = TaskEffect.shipped("add")
    p = save_live_model(eff.model, eff.task, tmp_path / "m.safetensors", n=16)
    model, task, split, n = load_live_model(p)
    assert (split, n) == ("test", 16)
    for (a, x), (b, y) in zip(eff.model.state_dict().items(), model.state_dict().items()): assert a == b and torch.equal(x, y)
    with pytest.raises(FileNotFoundError, match="the shipped ones are"): load_live_model("nope")
    from spline_transformers.model import Transformer
    m2 = Transformer(type(eff.model.cfg).from_dict({**eff.model.cfg.to_dict(), "attn_fn": "spline"}))
    with pytest.raises(ValueError, match="softmax attention"): TaskEffect(m2, eff.task).page_spec()


@pytest.fixture(scope="module")
def browser():
    from browser import require_browser, launch
    require_browser()
    with launch() as b: yield b


def _fit_editor():
    torch.manual_seed(0)
    act = LinearSpline(33, -8.0, 8.0, init="gelu", extrapolate="linear")
    net = SplineNet(act)
    xs = torch.linspace(-3, 3, 200).unsqueeze(1); ys = torch.sin(2 * xs)
    opt = torch.optim.Adam(net.weights(), lr=0.03)
    for _ in range(100):
        opt.zero_grad(); F.mse_loss(net(xs), ys).backward(); opt.step()
    return SplineEditor(act, effect=FitEffect(net, xs, ys, target="sin(2x)"), throttle=0)


def test_page_effects_match_the_library(browser, tmp_path):
    import plotly
    from browser import serve, open_page, console_errors
    from live_page import live_editors, check_drag, answer
    fit, add = _fit_editor(), SplineEditor(TaskEffect.shipped("add").model, effect=TaskEffect.shipped("add"), throttle=0)
    shutil.copy2(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", tmp_path / "plotly.min.js")
    for rel, f in site_files().items(): (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(f, tmp_path / rel)
    body = "".join(f"<div class='out'>{e._repr_mimebundle_()['text/html']}</div>" for e in (fit, add))
    (tmp_path / "index.html").write_text('<!doctype html><html><head><meta charset="utf-8"><script src="plotly.min.js"></script>'
                                          f"</head><body style='width:900px'>{body}</body></html>")
    with serve(tmp_path) as base:
        page, errors, outside = open_page(browser, f"{base}/index.html", viewport={"width": 1000, "height": 900})
        console = console_errors(page)
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4", timeout=30_000)
        ids = live_editors(page)
        assert len(ids) == 2, ids
        fit_id, add_id = ids
        b, a, lib = check_drag(page, fit_id, 16, -50)                       # the fit: a bump at x = 0
        assert f"mse {lib['mse']:.4f}" in a["title"], a["title"]          # the panel's title shows it
        b, a, lib = check_drag(page, add_id, 22, 70, site=tmp_path)       # the spike at x = 0.6, pulled down
        assert a["values"]["test accuracy"] < 1.0, a
        page.click(f"button[id='{add_id}-reset']")
        page.wait_for_function("(pid) => document.getElementById(pid + '-readout').dataset.state === 'done' && "
                               "JSON.parse(document.getElementById(pid + '-readout').dataset.values)['test accuracy'] === 1", arg=add_id, timeout=60_000)
        assert not errors and not console, (errors, console)
        assert not outside, outside
        page.context.close()
