"""Editors whose effect the page computes (the editor chapter's `PageEffect`), driven as a reader would: drag a knot with the
mouse, wait for the page's answer, and compute the library's value for the very spline the page used."""
import base64, json, tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

LIVE_IDS = "() => Object.keys((window.stLive && window.stLive.specs) || {})"


def live_editors(page):
    "The plot ids of the editors on `page` whose effect the page computes."
    return page.evaluate(LIVE_IDS)


def spec(page, pid):
    "What the page's twin of the effect holds (`PageEffect.page_spec()` plus the spline's grid and the panel)."
    return page.evaluate("(pid) => window.stLive.specs[pid]", pid)


def answer(page, pid):
    "The page's last answer: state, values (full precision), the spline it used, the readout's text and the panel's title (lines the site's `fit_figures.js` broke joined)."
    return page.evaluate("""(pid) => { const r = document.getElementById(pid + '-readout'), g = document.getElementById(pid + '-effect');
        return {state: r.dataset.state, values: r.dataset.values ? JSON.parse(r.dataset.values) : null,
                spline: r.dataset.spline ? JSON.parse(r.dataset.spline) : null, text: r.textContent,
                title: g && g.layout && g.layout.title ? String(g.layout.title.text || g.layout.title).replace(/<br[^>]*>/gi, ' ') : null,
                line: g && g._fullData ? g._fullData.map(t => Array.from(t.y || [])) : null}; }""", pid)


def drag_knot(page, pid, k, dy_px, steps=6, timeout=60_000):
    "Drag knot `k` of editor `pid` by `dy_px` pixels (up is negative) with the mouse; return the page's answer once it is in."
    runs = page.evaluate("(pid) => window.stLive.specs[pid].runs || 0", pid)
    page.evaluate("(pid) => document.getElementById(pid).scrollIntoView({block: 'center', behavior: 'instant'})", pid)   # the site scrolls smoothly otherwise
    page.wait_for_timeout(200)
    x, y = page.evaluate("""([pid, k]) => { const r = document.getElementById(pid).querySelector(`.shapelayer path[data-index="${k}"]`).getBoundingClientRect();
                                           return [r.x + r.width / 2, r.y + r.height / 2]; }""", [pid, k])
    page.mouse.move(x, y); page.mouse.down()
    for i in range(1, steps + 1): page.mouse.move(x + 2, y + dy_px * i / steps)
    page.mouse.up()
    page.wait_for_function("""([pid, n]) => { const s = window.stLive.specs[pid], r = document.getElementById(pid + '-readout');
                                             return (s.runs || 0) > n && r.dataset.state !== 'busy'; }""", arg=[pid, runs], timeout=timeout)
    return answer(page, pid)


def library_values(sp, spline, site=None):
    "The library's value of the effect described by the page's spec `sp` with the spline values `spline` (what the page used)."
    s = sp["spline"]
    if sp["kind"] == "spline_net":
        from spline_transformers.splines import LinearSpline
        from spline_transformers.editor import SplineNet
        d = sp["data"]
        act = LinearSpline(len(spline), s["x_min"], s["x_max"], extrapolate=s["extrapolate"])
        net = SplineNet(act, width=len(d["w1"]))
        with torch.no_grad():
            act.values.copy_(torch.tensor(spline))
            for n in ("w1", "b1", "w2", "b2"): getattr(net, n).copy_(torch.tensor(d[n]))
            x, y = torch.tensor(d["x"]).unsqueeze(1), torch.tensor(d["y"]).unsqueeze(1)
            return {"mse": F.mse_loss(net(x), y).item()}
    if sp["kind"] == "transformer_task":
        from spline_transformers.editor import load_live_model, TaskEffect, find_splines
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(site) / sp["src"] if sp.get("src") else Path(tmp) / "m.safetensors"
            if not sp.get("src"): path.write_bytes(base64.b64decode(sp["inline"]))
            model, task, split, n = load_live_model(path)
        with torch.no_grad(): find_splines(model)[s["name"]].values.copy_(torch.tensor(spline))
        return TaskEffect(model, task, split, n)()
    raise ValueError(f"unknown page effect {sp['kind']!r}")


def check_drag(page, pid, k, dy_px, site=None, tol=1e-4):
    "Drag knot `k`; the page's answer must have changed, be shown, and equal the library's within `tol`. Returns (before, after, library)."
    sp = spec(page, pid)
    before = library_values(sp, page.evaluate("(pid) => Array.from(document.getElementById(pid)._fullData[1].y)", pid), site)
    after = drag_knot(page, pid, k, dy_px)
    assert after["state"] == "done", after["text"]
    lib = library_values(sp, after["spline"], site)
    assert set(after["values"]) == set(lib), (after["values"], lib)
    for name, v in lib.items():
        assert abs(after["values"][name] - v) <= tol, f"{pid}: {name} page {after['values'][name]!r} vs library {v!r}"
    assert any(abs(after["values"][n] - before[n]) > 1e-3 for n in lib), f"{pid}: the drag changed nothing: {before} → {after['values']}"
    assert "computed in this page" in after["text"], after["text"]
    return before, after, lib
