"""Python-level behaviour of the widgets (no browser): sliders and knot drags write into the module's values and the
figure, reset/undo restore them, the effect panel follows, the collapse animation and the training monitor."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import plotly.graph_objects as go

from spline_transformers.splines import LinearSpline, SplineBank
from spline_transformers.editor import (SplineEditor, find_splines, static_editor_html, spline_figure, Throttle,
                                        has_widget_frontend, LiveFigure, ENV_WIDGETS)
from spline_transformers.widgets import collapse_figure, CollapsePlayer, TrainingMonitor, AnimationOutput
from spline_transformers.interpolation import build_interpolator, random_dataset, InterpolationDataError


@pytest.fixture
def spline():
    return LinearSpline(12, -3.0, 3.0, init="gelu")


def test_slider_writes_into_the_module_in_place(spline):
    ed = SplineEditor(spline)
    ptr, param = spline.values.data_ptr(), spline.values
    ed.move_slider(4, 1.25)
    assert spline.values is param and spline.values.data_ptr() == ptr          # same tensor, edited in place
    assert spline.values[4].item() == 1.25
    assert ed.fig.data[1].y[4] == 1.25 and ed.fig.layout.shapes[4].yanchor == 1.25
    assert ed.fig.data[2].x[0] == pytest.approx(spline.knots[4].item())       # the selected-knot marker follows
    assert spline(spline.knots[4:5]).item() == pytest.approx(1.25)             # the function changed


def test_drag_snaps_back_and_selects_the_knot(spline):
    ed = SplineEditor(spline)
    ed.drag_knot(7, -2.0, dx=0.4)
    assert spline.values[7].item() == -2.0
    assert ed.fig.layout.shapes[7].xanchor == pytest.approx(spline.knots[7].item())
    assert (ed.knot_slider.value, ed.value_slider.value) == (7, -2.0)
    assert ed.value_slider.min <= -2.0 <= ed.value_slider.max


def test_undo_and_resets(spline):
    v0 = spline.values.detach().clone()
    ed = SplineEditor(spline)
    ed.move_slider(2, 3.0); ed.move_slider(2, 4.0)        # one gesture, one undo step
    ed.drag_knot(5, 1.0)
    assert len(ed.history) == 2
    ed.reset("relu")
    assert torch.allclose(spline.values.detach(), torch.relu(spline.knots))
    ed.reset("exp")
    assert spline.values[-1].item() == pytest.approx(1.0)
    ed.undo(); assert torch.allclose(spline.values.detach(), torch.relu(spline.knots))
    ed.reset("learned"); assert torch.equal(spline.values.detach(), v0)
    while ed.undo(): pass
    assert torch.equal(spline.values.detach(), v0)
    assert list(ed.fig.data[1].y) == pytest.approx(v0.tolist())
    with pytest.raises(ValueError, match="pick one of"): ed.reset("tanh")
    with pytest.raises(ValueError, match="finite"): ed.set_values({0: math.nan})
    with pytest.raises(IndexError, match="out of range"): ed.set_values({99: 1.0})


def test_slider_echo_is_ignored(spline):
    "The browser rounds the slider to its step and sends the value back: that must not edit the spline."
    ed = SplineEditor(spline)
    ed.move_slider(9, 0.123456)
    n = len(ed.history)
    ed.value_slider.value = 0.123                 # what a step-0.001 slider echoes
    assert spline.values[9].item() == pytest.approx(0.123456) and len(ed.history) == n


def test_effect_runs_after_edits_and_is_throttled(spline):
    x = torch.linspace(-3, 3, 50)
    ed = SplineEditor(spline, effect=lambda: {"mean": spline(x).mean()}, throttle=0)
    m0 = ed.last_effect["mean"].item()
    ed.move_slider(6, 5.0)
    assert ed.last_effect["mean"].item() > m0 and "mean" in ed.effect_text.value
    assert ed.effect_fig.data[1].y[0] == pytest.approx(ed.last_effect["mean"].item())   # "now", next to the start
    slow = SplineEditor(LinearSpline(8, -1, 1), effect=lambda: np.ones((3, 3)), throttle=30)
    runs = slow.n_effect_runs
    for k in range(5): slow.move_slider(k, 1.0 + k)
    assert slow.n_effect_runs == runs              # throttled: still waiting
    slow.flush(); assert slow.n_effect_runs == runs + 1
    assert slow.effect_fig.data[0].type == "heatmap"


def test_effect_errors_are_shown_not_raised(spline):
    ed = SplineEditor(spline, effect=lambda: 1 / 0, throttle=0)
    ed.move_slider(1, 0.5)
    assert "ZeroDivisionError" in ed.effect_text.value and spline.values[1].item() == 0.5


def test_banks_and_models():
    bank = SplineBank(2, 8, -2, 2)
    ed = SplineEditor(bank)
    ed.select("spline[1]"); ed.move_slider(3, 9.0)
    assert bank.values[1, 3].item() == 9.0 and bank.values[0, 3].item() != 9.0
    ed.select("spline[0]"); ed.undo()                # undo switches back to the spline it edits
    assert ed.name == "spline[1]" and bank.values[1, 3].item() != 9.0
    with pytest.raises(KeyError, match="no spline called"): ed.select("nope")
    from spline_transformers.model import TransformerConfig, Transformer
    cfg = TransformerConfig(vocab_size=11, n_layers=2, d_model=16, n_heads=2, max_len=8, mlp_act="spline", attn_fn="spline",
                            mlp_init="gelu", attn_init="exp", pos="alibi")
    model = Transformer(cfg)
    refs = find_splines(model)
    assert set(refs) == {"mlp.0", "attn.0"} and refs["attn.0"].reference == "exp"
    tokens = torch.randint(0, 11, (2, 6))
    before = model(tokens).detach()
    med = SplineEditor(model); med.select("mlp.0"); med.reset("identity")
    assert not torch.allclose(model(tokens), before)
    med.undo(); assert torch.allclose(model(tokens), before)


def test_static_html_and_mimebundle(spline):
    ed = SplineEditor(spline)
    b = ed._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in b and "text/html" in b
    assert "shapePosition" in b["text/html"] and "plotly_relayout" in b["text/html"] and "Offline version" in b["text/html"]
    assert ed.fig._widget_data[1]["y"] is not None     # the widget state carries the data


def test_livefigure_opens_with_its_data():
    f = LiveFigure(spline_figure(find_splines(LinearSpline(4, -1, 1))["spline"]))
    assert len(f._widget_data) == 3 and len(f._widget_layout["shapes"]) == 4 and f.comm is not None


def test_collapse_animation():
    X, Y = random_dataset(N=2, d=2, n=4, m=2, pool=6, seed=3)
    T = build_interpolator(X, Y)
    fig = collapse_figure(T, X, Y)
    assert len(fig.frames) <= T.n_blocks + 1 and fig.layout.updatemenus[0].buttons[0].method == "animate"
    assert len(fig.layout.sliders[0].steps) == len(fig.frames)
    assert fig.layout.meta["stages"][-1] == "interpolation"
    last = fig.frames[-1].data
    for j, y in enumerate(Y):                           # every token of the last frame sits on a target
        pts = np.concatenate([np.c_[last[j].x, last[j].y], np.c_[last[2 + j].x, last[2 + j].y]])
        assert np.abs(pts[:, None] - y[None]).sum(-1).min(1).max() < 1e-6
    with pytest.raises(InterpolationDataError, match="d must be >= 2"): build_interpolator(*random_dataset(N=2, d=1))
    X, Y = random_dataset(N=3, d=2, n=2, m=3, seed=0)   # m > n is clamped: at most one target per input token
    assert all(len(y) == len(x) == 2 for x, y in zip(X, Y))


def test_collapse_player_rebuilds():
    p = CollapsePlayer(N=2, n=3, m=1, seed=0)
    p.rebuild(N=3, d=4)
    assert len(p.X) == 3 and p.X[0].shape[1] == 4 and p.fig.layout.xaxis.title.text == "PC 1"
    with pytest.raises(KeyError, match="unknown control"): p.rebuild(q=1)
    assert "text/html" in p._repr_mimebundle_()


def test_training_monitor_modes(monkeypatch, capsys):
    monkeypatch.setenv(ENV_WIDGETS, "0")
    assert not has_widget_frontend()
    with TrainingMonitor(total=5) as m:
        for s in range(5): m(s, loss=torch.tensor(1.0 / (s + 1)))
    assert not m.live and len(m.history) == 5 and m.history[-1]["loss"] == pytest.approx(0.2)
    monkeypatch.setenv(ENV_WIDGETS, "1")
    live = TrainingMonitor(total=4, show=False, throttle=0)
    assert live.live
    live({"step": 0, "loss": 2.0}); live(1, {"loss": 1.0, "token_acc": 0.5})
    assert live.fig.data[0].y == (2.0, 1.0) and live.progress.value == 2
    with pytest.raises(TypeError, match="call the monitor as"): live(1, 2, 3)


def test_throttle_trailing_call():
    import time
    calls = []
    th = Throttle(lambda: calls.append(1), interval=0.1)
    th(); th(); th()
    assert len(calls) == 1
    time.sleep(0.3)
    assert len(calls) == 2


def test_effect_panel_title_follows_the_model(spline):
    "Issue 18 (1): a figure effect's title is redrawn with its data; a number shows where it started and the change."
    x = torch.linspace(-3, 3, 20)
    def fig():
        f = go.Figure([go.Scatter(x=x, y=spline(x))]); f.update_layout(title=f"mean {float(spline(x).mean()):.4f}"); return f
    ed = SplineEditor(spline, effect=fig, throttle=0)
    ed.reset("identity")
    assert ed.effect_fig.layout.title.text == f"mean {float(spline(x).mean()):.4f}"
    assert ed.effect_fig._widget_layout["title"]["text"] == ed.effect_fig.layout.title.text
    num = SplineEditor(LinearSpline(8, -1, 1, init="gelu"), effect=lambda: {"loss": 2.728}, throttle=0)
    num.effect = lambda: {"loss": 2.732}; num.reset("relu")
    assert [t.y for t in num.effect_fig.data] == [[2.728], [2.732]] or [list(t.y) for t in num.effect_fig.data] == [[2.728], [2.732]]
    assert "2.728 → 2.732" in num.effect_fig.layout.title.text and "+0.004" in num.effect_text.value


def test_widget_state_follows_edits_for_a_reloaded_page():
    "Issue 18 (2): what a reloaded page asks the kernel for (the widget state) is the figure as it is now."
    from spline_transformers.model import TransformerConfig, Transformer
    cfg = TransformerConfig(vocab_size=11, n_layers=1, d_model=16, n_heads=2, max_len=8, mlp_act="spline", attn_fn="spline",
                            mlp_init="gelu", attn_init="exp", pos="alibi")
    ed = SplineEditor(Transformer(cfg))
    ed.select("attn.0"); ed.drag_knot(5, 3.0)
    state = ed.fig.get_state()
    assert state["_widget_layout"]["title"]["text"].startswith("attn.0")
    assert state["_widget_data"][1]["y"][5] == 3.0 and state["_widget_layout"]["shapes"][5]["yanchor"] == 3.0
    m = TrainingMonitor(total=3, live=True, show=False, throttle=0)
    m(0, loss=1.0); m(1, loss=0.5)
    assert [list(t["y"]) for t in m.fig.get_state()["_widget_data"]] == [[1.0, 0.5]]


def test_no_numpy_arrays_reach_a_figure_widget(spline):
    "Issue 18 (3): plotly's FigureWidget logs a traceback (plotly#4160) when the browser reports back a trace that holds"
    " numpy arrays; every array a LiveFigure holds is a plain list."
    ed = SplineEditor(spline, effect=lambda: np.arange(5.0) * spline.values[0].item(), throttle=0)
    ed.move_slider(3, 1.0); ed.select("spline"); ed.drag_knot(2, 0.5)
    for f in (ed.fig, ed.effect_fig):
        for t in f.data:
            for k in ("x", "y"): assert t[k] is None or isinstance(t[k], (list, tuple)), (k, type(t[k]))
        for t in f._widget_data:
            for k in ("x", "y"): assert k not in t or isinstance(t[k], (list, tuple)), (k, t[k])
        # what the browser sends back after drawing: its defaults for every trace (here: the drawn x and y as lists)
        deltas = [{"uid": t.uid, "x": list(t.x) if t.x is not None else None, "y": list(t.y)} for t in f.data]
        f._handler_js2py_traceDeltas({"new": {"trace_deltas": [{k: v for k, v in d.items() if v is not None} for d in deltas],
                                              "trace_edit_id": f._last_trace_edit_id}})


def test_late_slider_echo_is_not_an_edit(spline):
    "Issue 18 (4): the browser sends back, late, a value the editor put on the value slider; it must not become an edit."
    v0 = spline.values.detach().clone()
    ed = SplineEditor(spline)
    ed.drag_knot(3, -1.0)              # the editor puts -1.0 on the value slider (knot 3)
    ed.undo()                          # knot 3 is back where it was; the slider says so
    ed.value_slider.value = -1.0       # ...and only now the browser's echo of -1.0 arrives
    assert ed.history == [] and spline.values[3].item() != -1.0
    ed.move_slider(10, 2.5)            # a cell plays the reader: knot 10 (its value goes on the slider), then 2.5
    ed.drag_knot(3, -1.0); ed.undo(); ed.undo()  # ...then knot 3 again, and undoes it all
    for late in (round(float(v0[10]), 3), 2.5):   # the browser's echoes of both arrive after the cell
        ed.value_slider.value = late
    assert ed.history == [] and torch.equal(spline.values.detach(), v0)
    ed.value_slider.value = 0.777      # a real move is still an edit
    assert spline.values[ed.knot_slider.value].item() == pytest.approx(0.777) and len(ed.history) == 1
    ed.clear_history()
    assert ed.history == [] and ed.INSTRUCTIONS in ed.status.value


def test_player_output_is_set_not_captured(monkeypatch):
    "Issue 18 (4): the player puts its animation into its Output widget directly (a capture can spill into the running"
    " cell); its title names the seed."
    monkeypatch.setenv(ENV_WIDGETS, "1")
    p = CollapsePlayer(N=2, n=3, m=1, seed=7)
    assert len(p.out.outputs) == 1 and "application/vnd.plotly.v1+json" in p.out.outputs[0]["data"]
    assert "seed 7" in p.fig.layout.title.text
    p.rebuild(seed=8)
    assert len(p.out.outputs) == 1 and "seed 8" in p.out.outputs[0]["data"]["application/vnd.plotly.v1+json"]["layout"]["title"]["text"]


def test_animation_output_has_a_height():
    "Issue 18 (5): an animation drawn in a resizable output area carries an explicit height (a resize kept 29 px)."
    X, Y = random_dataset(N=2, d=3, n=4, m=2, pool=6, seed=3)
    fig = collapse_figure(build_interpolator(X, Y, attention="softmax"), X, Y)
    fig.layout.height = None
    layout = AnimationOutput(fig)._repr_mimebundle_()["application/vnd.plotly.v1+json"]["layout"]
    assert layout["height"] == 520


def test_value_slider_resolution(spline):
    "Issue 18 (7): the value slider spans the spline's range with a margin, in steps of 0.001 (it moved 0.21 per pixel)."
    ed = SplineEditor(LinearSpline(33, -8.0, 8.0, init="gelu"))
    sl = ed.value_slider
    assert sl.step <= 0.001 and (sl.max - sl.min) <= 1.6 * 8 + 2


def test_player_frames_all_move_and_symbols_differ():
    "Issue 18 (7): no frame repeats the one before (blocks that move nothing share a frame, its slider label says which);"
    " no sequence is drawn with the leaders' star."
    X, Y = random_dataset(N=3, d=2, n=5, m=2, pool=8, seed=0)
    fig = collapse_figure(build_interpolator(X, Y), X, Y)
    for a, b in zip(fig.frames[:-1], fig.frames[1:]):
        assert not all(np.allclose(s.x, t.x) and np.allclose(s.y, t.y) for s, t in zip(a.data, b.data))
    assert any("–" in s.label for s in fig.layout.sliders[0].steps)
    assert [s.args[0][0] for s in fig.layout.sliders[0].steps] == [f.name for f in fig.frames]
    assert len(fig.layout.meta["stages"]) == len(fig.frames)
    for t in fig.data:
        if t.name.startswith("sequence"): assert t.marker.symbol != "star", t.name


def test_value_slider_follows_the_knot_when_the_spline_changes():
    """Issue 28 (4): knot 40 of attn.0 (0.249) selected, the reader picks mlp.0: the value slider shows knot 0 of mlp.0,
    also after the browser sends back, late, the value it showed before (its echo of 0.249 is no edit, and no display)."""
    from spline_transformers.model import TransformerConfig, Transformer
    cfg = TransformerConfig(vocab_size=11, n_layers=2, d_model=16, n_heads=2, max_len=8, mlp_act="spline", attn_fn="spline",
                            mlp_init="gelu", attn_init="exp", pos="alibi")
    model = Transformer(cfg)
    ed = SplineEditor(model)
    with torch.no_grad(): ed.refs["attn.0"].values[40] = 0.249; ed.refs["attn.0"].values[0] = 0.5
    before = {n: r.values.detach().clone() for n, r in ed.refs.items()}
    ed.picker.set_state({"index": ed.picker.options.index("attn.0")})          # as the browser sends them: the drop-down, then the knot slider
    ed.knot_slider.set_state({"value": 40})
    assert ed.value_slider.value == 0.249
    ed.picker.set_state({"index": ed.picker.options.index("mlp.0")})
    knot0 = round(ed.refs["mlp.0"].values[0].item(), 3)
    assert (ed.name, ed.knot_slider.value, ed.value_slider.value) == ("mlp.0", 0, knot0)
    ed.value_slider.set_state({"value": 0.249})       # the slider, redrawn for its new range, reports what it showed
    assert ed.value_slider.value == knot0, "the value slider shows a value of the previous spline's knot"
    assert ed.history == [] and all(torch.equal(r.values.detach(), before[n]) for n, r in ed.refs.items())
    sent = []                                         # range and value reach the browser in one message
    ed.value_slider.send_state = lambda key=None: sent.append(key if key is None or isinstance(key, str) else set(key))
    ed.picker.set_state({"index": ed.picker.options.index("attn.0")})
    assert ed.value_slider.value == 0.5 and sent == [{"min", "max", "value"}], sent


def test_late_echo_clamped_into_a_narrower_range_is_not_an_edit(spline):
    """Issue 28: in JupyterLab the browser applies the echo of its own last message (the dragged knot's 6.0) after the undo's
    narrower range has arrived, clamps it to that range's end and sends the end back; that value is the browser's, not the
    reader's (CI saw `edits nobody made: knot 16 (slider)`). A reader who then moves the slider to the end still edits."""
    v0 = spline.values.detach().clone()
    ed = SplineEditor(spline)
    ed.drag_knot(6, 6.0)                       # the slider's range grows to hold 6.0 ...
    wide = ed.value_slider.max
    ed.undo()                                  # ... and shrinks back with the undo
    hi = ed.value_slider.max
    assert hi < 6.0 < wide, (hi, wide)
    for late in (6.0, hi):                     # the browser's echo of 6.0, then that echo clamped to the new range's end
        ed.value_slider.set_state({"value": late})
    assert ed.history == [] and torch.equal(spline.values.detach(), v0)
    assert ed.value_slider.value == round(v0[6].item(), 3)         # the slider shows the knot again
    ed.value_slider.set_state({"value": 0.5})  # the reader's own move ...
    ed.value_slider.set_state({"value": float(ed.value_slider.max)})   # ... to the end of the range is an edit
    assert len(ed.history) == 1 and spline.values[6].item() == pytest.approx(ed.value_slider.max)
