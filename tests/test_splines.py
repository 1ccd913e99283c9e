"""Splines: every backend against an independent reference (numpy.interp), gradcheck, NaN/inf, dtypes, banks,
backend selection and fallback, save/load errors, the Triton kernel under TRITON_INTERPRET=1 (in a subprocess)."""
import json, math, os, subprocess, sys, textwrap, warnings
from pathlib import Path

from conftest import build_docs

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import spline_transformers.splines as sp
from spline_transformers.splines import (LinearSpline, SplineBank, spline_eval, set_spline_backend, spline_backend,
                                         save_spline, load_spline, SplineFormatError, to_polynomial)

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(min(2, torch.get_num_threads()))


def np_spline(x, v, x_min, x_max, extrapolate):
    "Independent reference: numpy.interp inside, the documented extrapolation rule outside (float64)."
    x, v = np.asarray(x, np.float64), np.asarray(v, np.float64)
    K = len(v); knots = np.linspace(x_min, x_max, K); h = knots[1] - knots[0]
    with np.errstate(invalid="ignore"):
        y = np.interp(x, knots, v)           # constant beyond the ends
        if extrapolate == "linear":
            sl, sr = (v[1] - v[0]) / h, (v[-1] - v[-2]) / h
            left = np.where(sl == 0, v[0], v[0] + sl * (x - x_min))
            right = np.where(sr == 0, v[-1], v[-1] + sr * (x - x_max))
            y = np.where(x < x_min, left, np.where(x > x_max, right, y))
    return np.where(np.isnan(x), np.nan, y)


@pytest.fixture(params=["torch", "cpp"])
def backend(request):
    set_spline_backend(request.param)
    if request.param == "cpp" and spline_backend("cpu").name != "cpp":
        set_spline_backend("auto"); pytest.skip(f"cpp backend unavailable: {spline_backend('cpu').reason}")
    yield request.param
    set_spline_backend("auto")


def random_case(seed, K=17, n=4000, dtype=torch.float64, x_min=-3.0, x_max=2.0):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(K, generator=g, dtype=torch.float64)
    x = (torch.rand(n, generator=g, dtype=torch.float64) * 1.6 - 0.3) * (x_max - x_min) + x_min  # 30% outside
    x[:6] = torch.tensor([x_min, x_max, x_min - 1e-9, x_max + 1e-9, (x_min + x_max) / 2, x_min + (x_max - x_min) / (K - 1)], dtype=torch.float64)
    return x.to(dtype), v.to(dtype)


@pytest.mark.parametrize("extrapolate", ["constant", "linear"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_numpy_reference(backend, extrapolate, dtype):
    for seed in range(3):
        x, v = random_case(seed, dtype=dtype)
        y = spline_eval(x, v, -3.0, 2.0, extrapolate)
        assert y.dtype == dtype and y.shape == x.shape
        ref = np_spline(x.double().numpy(), v.double().numpy(), -3.0, 2.0, extrapolate)
        tol = 1e-12 if dtype == torch.float64 else 2e-5
        np.testing.assert_allclose(y.double().numpy(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("extrapolate", ["constant", "linear"])
def test_nan_and_inf(backend, extrapolate):
    v = torch.tensor([1.0, 2.0, -1.0, 3.0, 3.0])                     # right end segment is flat
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.5])
    y = spline_eval(x, v, -1.0, 1.0, extrapolate)
    assert torch.isnan(y[0])
    assert y[1].item() == 3.0                                       # flat end: v[-1] under both rules
    assert y[2].item() == (1.0 if extrapolate == "constant" else -math.inf)   # rising left segment, extended
    ref = np_spline(x.numpy(), v.numpy(), -1.0, 1.0, extrapolate)
    np.testing.assert_allclose(y[3].item(), ref[3], rtol=1e-6)


def test_nan_gradient_is_nan_in_values(backend):
    v = torch.randn(8, requires_grad=True)
    x = torch.tensor([0.1, float("nan"), 0.3], requires_grad=True)
    spline_eval(x, v, -1, 1).sum().backward()
    assert torch.isnan(v.grad).any() and torch.isfinite(x.grad[[0, 2]]).all()


@pytest.mark.parametrize("extrapolate", ["constant", "linear"])
def test_gradcheck_float64(backend, extrapolate):
    x, v = random_case(5, K=9, n=60)
    x = x + 1e-3 * torch.rand(60, dtype=torch.float64)       # keep away from exact knots (kinks)
    x.requires_grad_(); v.requires_grad_()
    assert torch.autograd.gradcheck(lambda x, v: spline_eval(x, v, -3.0, 2.0, extrapolate), (x, v))


@pytest.mark.parametrize("how", ["dim1", "dim_last", "index"])
def test_bank_gradcheck_and_reference(backend, how):
    g = torch.Generator().manual_seed(1)
    vb = torch.randn(3, 7, generator=g, dtype=torch.float64, requires_grad=True)
    x = (torch.rand(2, 3, 5, generator=g, dtype=torch.float64) * 6 - 3).requires_grad_()
    if how == "dim1": f = lambda x, v: spline_eval(x, v, -2, 2, dim=1)
    elif how == "dim_last": x = x.detach().transpose(1, 2).contiguous().requires_grad_(); f = lambda x, v: spline_eval(x, v, -2, 2, dim=-1)
    else: f = lambda x, v: spline_eval(x, v, -2, 2, index=1)
    assert torch.autograd.gradcheck(f, (x, vb))
    y = f(x, vb).detach().numpy(); xn, vn = x.detach().numpy(), vb.detach().numpy()
    for s in range(3):
        if how == "dim1": np.testing.assert_allclose(y[:, s], np_spline(xn[:, s], vn[s], -2, 2, "constant"), atol=1e-12)
        elif how == "dim_last": np.testing.assert_allclose(y[..., s], np_spline(xn[..., s], vn[s], -2, 2, "constant"), atol=1e-12)
    if how == "index": np.testing.assert_allclose(y, np_spline(xn, vn[1], -2, 2, "constant"), atol=1e-12)


def test_backends_agree_on_large_float32():
    "Value gradients summed over a million elements: the fused kernel's float64 histograms vs bincount."
    if spline_backend("cpu").name != "cpp": pytest.skip("cpp backend unavailable")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 1000, generator=g) * 4
    out = {}
    for b in ("torch", "cpp"):
        set_spline_backend(b)
        s = LinearSpline(32, -5, 5, init="gelu"); xg = x.clone().requires_grad_()
        w = torch.randn(1000, 1000, generator=torch.Generator().manual_seed(1))
        (s(xg) * w).sum().backward()
        out[b] = (s(x).detach(), xg.grad, s.values.grad)
    set_spline_backend("auto")
    for a, b in zip(out["torch"], out["cpp"]): torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes_compute_in_float32(backend, dtype):
    s = LinearSpline(16, -4, 4, init="gelu")
    x = torch.linspace(-5, 5, 101).to(dtype).requires_grad_()
    y = s(x)
    assert y.dtype == dtype
    torch.testing.assert_close(y.float(), s(x.detach().float()).to(dtype).float())
    y.float().sum().backward()
    assert x.grad.dtype == dtype and s.values.grad.dtype == torch.float32


def test_non_contiguous_input(backend):
    s = LinearSpline(16, -4, 4, init="relu")
    x = torch.randn(40, 30).t()[::2]
    assert not x.is_contiguous()
    torch.testing.assert_close(s(x), s(x.contiguous()))


def test_module_api_and_inits():
    s = LinearSpline(n_knots=64, x_min=-15.0, x_max=15.0, init="gelu", extrapolate="constant")
    assert s.knots.shape == (64,) and s.values.shape == (64,) and "knots" in dict(s.named_buffers())
    assert [n for n, _ in s.named_parameters()] == ["values"]
    knots = torch.linspace(-5, 5, 11)
    for init, f in [("relu", torch.relu), ("identity", lambda a: a), ("zeros", torch.zeros_like),
                    ("exp", lambda a: torch.exp(a - 5)), (0.01, lambda a: torch.full_like(a, 0.01)), (torch.tanh, torch.tanh)]:
        torch.testing.assert_close(LinearSpline(11, -5, 5, init=init).values.detach(), f(knots))
    with pytest.raises(ValueError, match="'gelu', 'relu'"): LinearSpline(init="swish")
    with pytest.raises(ValueError, match="'constant', 'linear'"): LinearSpline(extrapolate="reflect")
    with pytest.raises(ValueError, match="x_min < x_max"): LinearSpline(x_min=1, x_max=1)
    with pytest.raises(ValueError, match="one value per knot"): LinearSpline(8, init=lambda a: a[:3])
    with pytest.raises(TypeError, match="floating-point"): s(torch.arange(3))


def test_bank_errors():
    bank = SplineBank(4, 8, -2, 2)
    x = torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match="index="): bank(x)
    with pytest.raises(ValueError, match="length 3 but the bank holds 4"): bank(x, dim=2)
    with pytest.raises(IndexError, match="out of range"): bank(x, index=4)
    with pytest.raises(ValueError, match="not both"): bank(x, index=0, dim=1)


@pytest.mark.slow
def test_backend_selection_and_env():
    with pytest.raises(ValueError, match="'auto', 'cpp', 'triton', 'torch'"): set_spline_backend("cuda")
    set_spline_backend("torch"); assert spline_backend().name == "torch" and "requested" in spline_backend().reason
    set_spline_backend("auto")
    code = "import spline_transformers.splines as s; print(s.spline_backend('cpu').name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "SPLINE_TRANSFORMERS_BACKEND": "torch"}, timeout=120)
    assert out.stdout.strip() == "torch", out.stderr


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env}, timeout=300)


def test_fallback_warns_once_with_reason(tmp_path):
    "No compiler (a fake one that fails) -> torch backend, one warning naming the reason, same numbers."
    fake = tmp_path / "fakecxx"; fake.write_text("#!/bin/sh\necho 'error: simulated compiler failure' >&2\nexit 1\n"); fake.chmod(0o755)
    code = """
        import warnings, torch
        import spline_transformers.splines as s
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            x = torch.randn(100)
            y1 = s.LinearSpline(8, -2, 2)(x); y2 = s.LinearSpline(8, -2, 2)(x)
        msgs = [str(m.message) for m in w if "pure-PyTorch" in str(m.message)]
        print(len(msgs)); print(msgs[0]); print(s.spline_backend('cpu'))
    """
    out = _run(code, CXX=str(fake), TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    lines = out.stdout.strip().splitlines()
    assert lines and lines[0] == "1", out.stdout + out.stderr
    assert "cpp backend is unavailable" in lines[1] and "compiling the C++ kernel failed" in lines[1]
    assert "name='torch'" in lines[2]


def test_requested_cpp_on_cuda_is_clear_error():
    set_spline_backend("cpp")
    try:
        with pytest.raises(RuntimeError, match="cannot run cuda"): sp._choose("cuda")
    finally: set_spline_backend("auto")


TRITON_CHECK = """
    import os, math, torch, numpy as np
    assert os.environ["TRITON_INTERPRET"] == "1"
    import spline_transformers.splines as sp
    sp.set_spline_backend("triton")
    choice = sp.spline_backend("cpu"); assert choice.name == "triton", choice
    T, R = sp._load("triton")[0], sp._TorchBackend
    n_ok = 0
    for dt in (torch.float64, torch.float32):
        for ext in ("constant", "linear"):
            for S, inner, shape in [(1, 1, (700,)), (3, 1030, (1, 3, 1030)), (3, 1, (50, 3)), (4, 7, (3, 4, 7))]:
                g = torch.Generator().manual_seed(S + inner)
                v = torch.randn(S, 16, generator=g, dtype=dt); x = (torch.rand(shape, generator=g, dtype=dt) * 14 - 7).reshape(-1)
                x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 5.0]); v[0, 0] = v[0, 1]
                gy = torch.randn(x.shape, generator=g, dtype=dt)
                y, yr = T.forward(x, v, -5, 5, ext, S, inner), R.forward(x, v, -5, 5, ext, S, inner)
                gx, gv = T.backward(gy, x, v, -5, 5, ext, S, inner, True, True)
                gxr, gvr = R.backward(gy, x, v, -5, 5, ext, S, inner, True, True)
                tol = 1e-10 if dt == torch.float64 else 1e-4
                torch.testing.assert_close(y, yr, rtol=tol, atol=tol, equal_nan=True)
                torch.testing.assert_close(gx, gxr, rtol=tol, atol=tol, equal_nan=True)
                torch.testing.assert_close(gv, gvr, rtol=1e-3, atol=1e-3, equal_nan=True)
                n_ok += 1
    # against numpy.interp, through the public function
    x = torch.linspace(-8, 8, 997, dtype=torch.float64); v = torch.randn(12, dtype=torch.float64)
    kn = np.linspace(-5, 5, 12)
    np.testing.assert_allclose(sp.spline_eval(x, v, -5, 5).numpy(), np.interp(x.numpy(), kn, v.numpy()), atol=1e-12)
    x = (torch.rand(12, dtype=torch.float64) * 12 - 6).requires_grad_(); v = v.requires_grad_()
    for ext in ("constant", "linear"):
        assert torch.autograd.gradcheck(lambda x, v: sp.spline_eval(x, v, -5, 5, ext), (x, v))
    vb = torch.randn(3, 6, dtype=torch.float64, requires_grad=True); xb = (torch.rand(1, 3, 3, dtype=torch.float64) * 6 - 3).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, v: sp.spline_eval(x, v, -2, 2, dim=1), (xb, vb))
    print("TRITON_OK", n_ok)
"""


@pytest.mark.slow
def test_triton_kernel_under_interpreter():
    pytest.importorskip("triton")
    out = _run(TRITON_CHECK, TRITON_INTERPRET="1")
    assert "TRITON_OK 16" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]


# ---- save / load ----

@pytest.mark.parametrize("suffix", [".json", ".safetensors"])
def test_save_load_roundtrip(tmp_path, suffix):
    s = LinearSpline(20, -6, 4, init="gelu", extrapolate="linear")
    with torch.no_grad(): s.values.add_(torch.randn(20))
    back = load_spline(save_spline(s, tmp_path / f"s{suffix}"))
    assert type(back) is LinearSpline and back.extrapolate == "linear" and (back.x_min, back.x_max) == (-6.0, 4.0)
    torch.testing.assert_close(back.values, s.values, rtol=0, atol=0)
    bank = SplineBank(3, 9, -2, 2, init="exp")
    bb = SplineBank.load(save_spline(bank, tmp_path / f"b{suffix}"))
    torch.testing.assert_close(bb.values, bank.values, rtol=0, atol=0)


def _json_with(tmp_path, **changes):
    s = LinearSpline(8, -2, 2, init="relu")
    rec = json.loads(save_spline(s, tmp_path / "ok.json").read_text())
    for k, f in changes.items(): rec[k] = f(rec[k]) if callable(f) else f
    p = tmp_path / "bad.json"; p.write_text(json.dumps(rec).replace("Infinity", "Infinity"))
    return p


@pytest.mark.parametrize("change, message", [
    (dict(values=lambda v: v[:-1]), "knots have shape"),
    (dict(values=lambda v: v[:3] + [float("nan")] + v[4:]), "non-finite"),
    (dict(knots=lambda k: k[::-1]), "not strictly increasing"),
    (dict(knots=lambda k: k[:2] + [k[2] + 0.1] + k[3:]), "not evenly spaced"),
    (dict(x_max=3.0), "not the stated range"),
    (dict(extrapolate="mirror"), "extrapolate 'mirror'"),
    (dict(kind="Spline2D"), "kind 'Spline2D'"),
    (dict(format="other/v9"), "format 'other/v9'"),
    (dict(values=lambda v: [v, v]), "needs 1-D values"),
])
def test_load_rejects_bad_files(tmp_path, change, message):
    with pytest.raises(SplineFormatError, match=message): load_spline(_json_with(tmp_path, **change))


def test_load_errors_misc(tmp_path):
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(SplineFormatError, match="cannot read"): load_spline(tmp_path / "junk.json")
    (tmp_path / "partial.json").write_text(json.dumps({"format": sp.SPLINE_FORMAT}))
    with pytest.raises(SplineFormatError, match="missing field"): load_spline(tmp_path / "partial.json")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(SplineFormatError, match="cannot read"): load_spline(tmp_path / "junk.safetensors")
    with pytest.raises(FileNotFoundError): load_spline(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="use .json or .safetensors"): save_spline(LinearSpline(4), tmp_path / "s.pkl")
    bank_path = save_spline(SplineBank(2, 4), tmp_path / "bank.safetensors")
    with pytest.raises(SplineFormatError, match="holds a SplineBank"): LinearSpline.load(bank_path)


# ---- polynomial ----

def test_to_polynomial_error_and_clamp():
    s = LinearSpline(33, -4, 4, init=lambda a: torch.tanh(a) + 0.1 * a)
    errs = [to_polynomial(s, d).max_error for d in (4, 8, 16, 32)]
    assert errs == sorted(errs, reverse=True) and errs[-1] < 0.02
    p = s.to_polynomial(16)
    grid = torch.linspace(-4, 4, 5001)
    measured = (p(grid) - s(grid)).abs().max().item()
    assert measured <= p.max_error * 1.05 + 1e-6 and measured >= p.max_error * 0.5
    torch.testing.assert_close(p(torch.tensor([-1e6, 1e6])), p(torch.tensor([-4.0, 4.0])))
    assert torch.isnan(p(torch.tensor([float("nan")]))).all()
    with pytest.raises(ValueError, match="index="): to_polynomial(SplineBank(2, 8), 4)


# ---- figures ----

def test_figures():
    s = LinearSpline(16, -5, 5, init="gelu")
    fig = sp.plot_spline(s, reference="gelu")
    names = [t.name for t in fig.data]
    assert "gelu" in names and "spline" in names
    assert len(sp.plot_spline(SplineBank(3, 8)).data) == 1 + 2 * 3
    d = sp.plot_derivative(s)
    ys = np.asarray(d.data[-1].y); assert ys[0] == 0 and ys[-1] == 0            # flat beyond the range
    with pytest.raises(ValueError, match="'gelu', 'relu'"): sp.plot_spline(s, reference="swish")


# ---- property test: random ranges and resolutions ----

@settings(max_examples=40, deadline=None)
@given(K=st.integers(2, 70), x_min=st.floats(-50, 10), width=st.floats(0.1, 60), seed=st.integers(0, 10_000),
       extrapolate=st.sampled_from(["constant", "linear"]), name=st.sampled_from(["torch", "cpp"]))
def test_property_random_grids(K, x_min, width, seed, extrapolate, name):
    set_spline_backend(name)
    try:
        if spline_backend("cpu").name != name:   # the cpp backend needs a compiler: say so rather than test torch twice
            pytest.skip(f"backend {name!r} is not available here: {spline_backend('cpu').reason}")
        assert spline_backend("cpu").name == name
        g = torch.Generator().manual_seed(seed)
        x_max = x_min + width
        v = torch.randn(K, generator=g, dtype=torch.float64) * 3
        x = x_min - 0.5 * width + 2 * width * torch.rand(257, generator=g, dtype=torch.float64)
        y = spline_eval(x, v, x_min, x_max, extrapolate).numpy()
        np.testing.assert_allclose(y, np_spline(x.numpy(), v.numpy(), x_min, x_max, extrapolate), rtol=1e-9, atol=1e-9)
    finally: set_spline_backend("auto")


@pytest.mark.parametrize("K", [2, 3, 16, 17, 32, 33, 64, 65, 128, 129, 200])
def test_float32_every_table_size(backend, K):
    "float32 paths per K (in-register lookups for K <= 32/64/128, memory tables above), odd lengths, both rules."
    g = torch.Generator().manual_seed(K)
    v = torch.randn(K, generator=g)
    x = torch.rand(1001, generator=g) * 14 - 7
    x[::97] = float("nan")
    for ext in ("constant", "linear"):
        vv = v.clone().requires_grad_(); xx = x.clone().requires_grad_()
        y = spline_eval(xx, vv, -5, 5, ext)
        ref = np_spline(x.double().numpy(), v.double().numpy(), -5, 5, ext)
        np.testing.assert_allclose(y.detach().double().numpy(), ref, rtol=1e-4, atol=1e-4)
        gy = torch.randn(1001, generator=g)
        (y * gy).sum().backward()
        set_spline_backend("torch")
        vr = v.clone().requires_grad_(); xr = x.clone().requires_grad_()
        (spline_eval(xr, vr, -5, 5, ext) * gy).sum().backward()
        set_spline_backend(backend)
        torch.testing.assert_close(xx.grad, xr.grad, rtol=1e-5, atol=1e-5)   # NaN inputs too: same rule everywhere
        torch.testing.assert_close(vv.grad, vr.grad, rtol=1e-4, atol=1e-4, equal_nan=True)



@pytest.mark.parametrize("S, K, dim", [(3, 16, 1), (20, 32, 1), (40, 64, -1)])   # S K = 48, 640, 2560: every histogram layout
def test_float32_bank_gradients_match_the_reference(backend, S, K, dim):
    "float32 banks through the fused backward (lane-private histograms, per-spline bins) against float64 bincount sums."
    g = torch.Generator().manual_seed(S)
    v = torch.randn(S, K, generator=g)
    shape = (5, S, 301) if dim == 1 else (7, 33, S)
    x = torch.randn(*shape, generator=g) * 3; x.view(-1)[::89] = float("nan")
    gy = torch.randn(*shape, generator=g)
    vv = v.clone().requires_grad_(); xx = x.clone().requires_grad_()
    (spline_eval(xx, vv, -4, 4, dim=dim) * gy).sum().backward()
    # reference: each element's (1 - f, f) shares of gy go to its segment's two knots (NaN inputs: segment 0, share NaN)
    xs = x.movedim(dim, -1).double(); gs = gy.movedim(dim, -1).double()
    t = ((xs + 4) * (K - 1) / 8).clamp(0, K - 1)
    i = t.nan_to_num(0).floor().clamp(max=K - 2); f = torch.where(xs.isnan(), xs, t - i)
    ref = torch.zeros(S, K, dtype=torch.float64)
    for s in range(S):
        ii, ff, gg = i[..., s].reshape(-1).long(), f[..., s].reshape(-1), gs[..., s].reshape(-1)
        ref[s].index_add_(0, ii, gg * (1 - ff)); ref[s].index_add_(0, ii + 1, gg * ff)
    torch.testing.assert_close(vv.grad.double(), ref, rtol=1e-5, atol=1e-4, equal_nan=True)

# ---- issue 14: concurrent saves, checksums, early validation ----

@pytest.mark.parametrize("suffix", [".json", ".safetensors"])
def test_concurrent_saves_never_crash(tmp_path, suffix):
    "Two writers saving to one path at once: neither dies, and the file always loads (no fixed <path>.tmp to race on)."
    import threading
    path = tmp_path / f"s{suffix}"
    splines = [LinearSpline(16, -2, 2, init=i) for i in ("gelu", "relu")]
    errors = []
    def writer(s):
        try:
            for _ in range(40): save_spline(s, path)
        except Exception as e: errors.append(e)
    threads = [threading.Thread(target=writer, args=(s,)) for s in splines]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors, errors
    back = load_spline(path).values.detach()
    assert any(torch.equal(back, s.values.detach()) for s in splines)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]   # no temporary file left behind


def _flip_payload_byte(path):
    "Change the last byte of a safetensors file (inside the last tensor's data) so the values stay finite."
    data = bytearray(path.read_bytes())
    data[-4] ^= 0x01   # lowest mantissa byte of the last float32: a tiny, finite change
    path.write_bytes(bytes(data))


def test_safetensors_spline_checksum(tmp_path):
    s = LinearSpline(8, -2, 2, init="gelu")
    p = save_spline(s, tmp_path / "s.safetensors")
    from safetensors import safe_open
    with safe_open(str(p), framework="pt") as f: assert len(f.metadata()["sha256"]) == 64
    _flip_payload_byte(p)
    with pytest.raises(SplineFormatError, match=r"s\.safetensors.*checksum"): load_spline(p)


def test_safetensors_spline_without_checksum_loads_with_warning(tmp_path):
    "Files written before checksums existed still load, with a warning saying they cannot be verified."
    from safetensors.torch import save_file
    s = LinearSpline(8, -2, 2, init="relu")
    rec = {"format": sp.SPLINE_FORMAT, "kind": "LinearSpline", "n_knots": "8", "x_min": "-2.0", "x_max": "2.0", "extrapolate": "constant"}
    p = tmp_path / "old.safetensors"
    save_file({"values": s.values.detach().contiguous(), "knots": s.knots.contiguous()}, str(p), metadata=rec)
    with pytest.warns(UserWarning, match="no checksum"): back = load_spline(p)
    assert torch.equal(back.values.detach(), s.values.detach())


def test_bank_index_must_be_an_integer():
    bank = SplineBank(3, 8, -2, 2, init="relu")
    x = torch.randn(5)
    for bad in (torch.tensor(1.0), 1.0, True, torch.tensor(True), torch.tensor([1])):
        with pytest.raises(ValueError, match="index must be an integer"): bank(x, index=bad)
    for good in (1, np.int64(1), torch.tensor(1)):
        torch.testing.assert_close(bank(x, index=good), bank(x, index=1))
    with pytest.raises(ValueError, match="dim must be an integer"): bank(torch.randn(2, 3), dim=1.0)
    torch.testing.assert_close(bank(torch.randn(2, 3).abs(), dim=np.int64(1)).shape, (2, 3))


def test_numpy_and_tensor_integers_are_ints():
    s = LinearSpline(np.int64(8), np.float32(-2), 2)
    assert s.n_knots == 8 and type(s.n_knots) is int
    b = SplineBank(torch.tensor(3), np.int32(8), -2, 2)
    assert b.n_splines == 3 and type(b.n_splines) is int and b.values.shape == (3, 8)
    assert to_polynomial(s, degree=np.int64(4)).degree == 4
    for bad in (dict(n_knots=1), dict(n_knots=8.0), dict(n_knots=True)):
        with pytest.raises(ValueError, match="n_knots"): LinearSpline(**bad)
    with pytest.raises(ValueError, match="n_splines"): SplineBank(2.0, 8)


def test_kernel_sources_ship_as_package_files():
    "The C++ kernels are package files (shipped as package data), read at import; the chapters show them at the end."
    import tomllib
    import spline_transformers.attention as at
    pkg = ROOT / "spline_transformers"
    assert sp.CPP_SOURCE == (pkg / "csrc" / "spline.cpp").read_text() == sp.kernel_source("spline.cpp")
    assert at.ATTN_CPP_SOURCE == (pkg / "csrc" / "attention.cpp").read_text()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["spline_transformers"]
    assert "csrc/*.cpp" in data


def _exported_defs(nb):
    "Names of the classes and functions defined in a notebook's exported cells, in order."
    import ast
    names = []
    for c in json.loads(build_docs.chapter(Path(nb).stem).read_text())["cells"]:
        s = "".join(c["source"])
        if c["cell_type"] != "code" or not s.startswith("#| export"): continue
        names += [n.name for n in ast.parse(s).body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
    return names


@pytest.mark.parametrize("nb, first", [("01_splines.ipynb", "LinearSpline"), ("02_attention.ipynb", "attend")])
def test_chapter_introduces_its_object_before_its_kernels(nb, first):
    src = json.dumps(json.loads(build_docs.chapter(Path(nb).stem).read_text())["cells"])
    names = _exported_defs(nb)
    assert names[0] == first, names[:3]
    assert "#include" not in src.split(first)[0]          # no C++ before the object
    assert src.index("## How it is made fast") > src.index(f"class {first}" if first[0].isupper() else f"def {first}")

# ---- issue 25: determinism as a tested promise ----

def _values_and_grads(x, w, v, ext, dim):
    "Spline values, input gradient and keypoint gradient for upstream gradient `w`."
    xx, vv = x.clone().requires_grad_(), v.clone().requires_grad_()
    y = spline_eval(xx, vv, -4.0, 4.0, ext, dim=dim)
    y.backward(w)
    return y.detach(), xx.grad, vv.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape, S, dim, ext", [
    ((7, 131, 97), 1, None, "constant"),     # sizes that no thread count divides
    ((7, 131, 97), 1, None, "linear"),
    ((3, 1, 1023), 1, None, "constant"),
    ((16, 256, 512), 1, None, "constant"),   # (64, 256, 512) trimmed to 2 M elements: many chunks
    ((16, 256, 512), 512, -1, "constant"),   # a bank of 512 splines along the last dim (runs of one element)
    ((5, 40, 3001), 40, 1, "linear"),        # a bank along dim 1 (long runs)
])
def test_bitwise_deterministic_across_threads_and_runs(backend, shape, S, dim, ext, dtype):
    "Values, input gradients and keypoint gradients (64 knots) are bitwise equal for 1, 2 and 4 threads and across runs."
    g = torch.Generator().manual_seed(25)
    x = (torch.randn(*shape, generator=g) * 2.5).to(dtype)
    w = torch.randn(*shape, generator=g).to(dtype)
    v = (torch.randn(64, generator=g) if S == 1 else torch.randn(S, 64, generator=g)).to(dtype)
    before = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 2, 4, 1, 4, 2):   # each thread count twice, in a changing order
            torch.set_num_threads(n)
            runs.append((n, _values_and_grads(x, w, v, ext, dim)))
    finally: torch.set_num_threads(before)
    ref = runs[0][1]
    assert torch.isfinite(ref[2]).all() and ref[2].abs().sum() > 0
    for n, got in runs[1:]:
        for what, a, b in zip(("value", "input gradient", "keypoint gradient"), ref, got):
            assert torch.equal(a, b), f"{backend}: {what} differs between 1 and {n} threads ({shape}, {dtype}, S={S})"


@pytest.mark.slow
def test_kernel_code_paths_give_bitwise_equal_gradients():
    "The fused kernel built as is, without AVX-512 and without AVX2 (three code paths on an AVX-512 CPU): the same gradients, bit for bit."
    from spline_transformers.core import CPP_FLAGS, build_cpp_extension
    mods = {}
    for tag, extra in [("native", []), ("no-avx512", ["-mno-avx512f"]), ("no-avx2", ["-mno-avx2", "-mno-fma"])]:
        module, why = build_cpp_extension("spline_transformers_cpu_", sp.CPP_SOURCE, ["spline_forward", "spline_backward"],
                                          flags=CPP_FLAGS + extra)
        if module is None: pytest.skip(why)   # no compiler or ninja: nothing to compare
        mods[tag] = module
    g = torch.Generator().manual_seed(3)
    for shape, S, inner in [((7, 131, 97), 1, 1), ((6, 5, 333), 5, 333), ((40, 7, 3), 7, 3)]:
        for K in (5, 16, 33, 64, 100, 129):   # every register-table size of both vector paths, and gathers / scalar above
            for linear in (False, True):
                x = torch.randn(*shape, generator=g) * 3
                x.view(-1)[::997] = float("nan"); x.view(-1)[5::1999] = float("inf"); x.view(-1)[7::1999] = -float("inf")
                w, v = torch.randn(*shape, generator=g), torch.randn(S, K, generator=g)
                got = {t: m.spline_backward(w, x, v, -4.0, 4.0, linear, S, inner, True, True) for t, m in mods.items()}
                for t in ("no-avx512", "no-avx2"):
                    for what, a, b in zip(("input gradient", "keypoint gradient"), got["native"], got[t]):
                        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)), \
                            f"{what} differs between the native and the {t} build (shape {shape}, S={S}, K={K}, linear={linear})"
