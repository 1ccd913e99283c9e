"""Attention, Transformer, Nonlinearities and Ensemble: behaviour that must hold for every option."""
import itertools
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from spline_transformers.attention import (ATTN_FNS, POSITIONS, attend, attention_mask, alibi_bias, attention_weights,
                                           set_attention_backend, attention_backend, record_scores)
from spline_transformers.splines import LinearSpline
from spline_transformers.model import (TransformerConfig, Transformer, Nonlinearities, MLP_ACTS, SHARINGS,
                                       future_leak, record_preactivations)
from spline_transformers.ensemble import Ensemble, per_model_loss

torch.set_num_threads(1)

CFG = TransformerConfig(vocab_size=11, n_layers=2, d_model=16, n_heads=2, max_len=12,
                        mlp_act="spline", attn_fn="spline", pos="alibi", attn_init="exp", mlp_init="gelu")


def tokens(B=2, T=9, seed=0, vocab=11):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- attention
@pytest.fixture(params=["auto", "torch"])
def kernel(request):
    "Run a test with the fused C++ weights kernel (where it builds) and with the plain PyTorch path."
    set_attention_backend(request.param)
    yield request.param
    set_attention_backend("auto")


@pytest.mark.parametrize("extrapolate", ["constant", "linear"])
@pytest.mark.parametrize("padded", [False, True])
def test_fused_and_torch_paths_agree(extrapolate, padded):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 4, dtype=torch.float64) * 1.5 for _ in range(3))
    s = LinearSpline(n_knots=12, x_min=-2.0, x_max=2.0, init=lambda a: torch.cos(2 * a) + 1.5, extrapolate=extrapolate)
    pm = torch.zeros(2, 9, dtype=torch.bool)
    if padded: pm[1, :3] = True
    mask = attention_mask(9, causal=False, padding_mask=pm)
    res = []
    for kern in ("auto", "torch"):
        set_attention_backend(kern)
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v)); s.zero_grad()
        out = attend(qq, kk, vv, "spline", phi=s, mask=mask, bias=alibi_bias(3, 9, dtype=torch.float64))
        out.square().sum().backward()
        res.append([out, qq.grad, kk.grad, vv.grad, s.values.grad.clone()])
    set_attention_backend("auto")
    for a, b in zip(*res):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    assert attention_backend().name in ("cpp", "torch")


@pytest.mark.parametrize("alibi,padded", list(itertools.product([False, True], [False, True])))
def test_exp_spline_kernel_reproduces_softmax(alibi, padded, kernel):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 10, 8) for _ in range(3))
    s = LinearSpline(n_knots=2001, x_min=-12.0, x_max=12.0, init="exp")
    pm = torch.zeros(2, 10, dtype=torch.bool)
    if padded: pm[0, :4] = True
    mask = attention_mask(10, causal=False, padding_mask=pm)
    bias = alibi_bias(3, 10) if alibi else None
    ref = attend(q, k, v, "softmax", mask=mask, bias=bias)
    out = attend(q, k, v, "spline", phi=s, mask=mask, bias=bias)
    h = s.h
    assert (out - ref).abs().max() < 10 * h ** 2  # interpolation error of exp, h^2/8 relative
    A = attention_weights(q, k, "spline", phi=s, mask=mask, bias=bias)
    A_ref = attention_weights(q, k, "softmax", mask=mask, bias=bias)
    assert (A - A_ref).abs().max() < h ** 2


def test_spline_kernel_masked_entries_contribute_nothing(kernel):
    # a kernel with a large boundary value: masked (future) keys would dominate if they were not zeroed
    s = LinearSpline(n_knots=5, x_min=-1.0, x_max=1.0, init=lambda a: 100.0 - 99 * (a + 1) / 2)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 6, 4) for _ in range(3))
    out = attend(q, k, v, "spline", phi=s)
    v2 = v.clone(); v2[..., 3:, :] += 1000.0
    assert torch.allclose(attend(q, k, v2, "spline", phi=s)[..., :3, :], out[..., :3, :])
    A = attention_weights(q, k, "spline", phi=s)
    assert torch.all(A.triu(1) == 0)


def test_spline_kernel_denominator_guard_and_stats():
    q = torch.zeros(1, 1, 4, 2); k = torch.zeros(1, 1, 4, 2); v = torch.ones(1, 1, 4, 2)
    stats = {}
    out = attend(q, k, v, "spline", phi=lambda s: s * 0.0, stats=stats)   # every weight 0: the guard must fire
    assert torch.isfinite(out).all() and out.abs().max() == 0
    assert stats["frac_guarded_rows"] == 1.0
    out = attend(q, k, v, "spline", phi=lambda s: s - 1.0, stats=stats)   # every weight -1: rows sum to -n
    assert torch.allclose(out, v) and stats["frac_negative_weights"] == 1.0 and stats["frac_guarded_rows"] == 0.0


def test_hardmax_ties_are_uniform():
    q = torch.ones(1, 1, 3, 1); k = torch.tensor([[[[1.0], [1.0], [0.0]]]]); v = torch.tensor([[[[0.0], [2.0], [9.0]]]])
    out = attend(q, k, v, "hardmax", causal=False)
    assert torch.allclose(out[0, 0, :, 0], torch.tensor([1.0, 1.0, 1.0]))


def test_rows_without_keys_give_zero_not_nan(kernel):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, requires_grad=True) for _ in range(3))
    pm = torch.tensor([[True, True, False, False, False]])
    mask = attention_mask(5, causal=False, padding_mask=pm)
    s = LinearSpline(n_knots=64, init=1.0)
    for fn in ATTN_FNS:
        out = attend(q, k, v, fn, phi=s, mask=mask)
        assert torch.isfinite(out).all() and out[:, :, :2].abs().max() == 0, fn
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v)), fn


# ---------------------------------------------------------------- model
@pytest.mark.parametrize("attn_fn,pos", list(itertools.product(ATTN_FNS, POSITIONS)))
def test_no_future_leak(attn_fn, pos, kernel):
    torch.manual_seed(0)
    model = Transformer(replace(CFG, attn_fn=attn_fn, pos=pos, attn_init=1.0, mlp_init="gelu"))
    for p in (1, 4, 8):
        assert future_leak(model, T=9, pos=p) == 0.0


@pytest.mark.parametrize("attn_fn,pos", list(itertools.product(ATTN_FNS, POSITIONS)))
def test_padding_keys_are_ignored(attn_fn, pos, kernel):
    "Changing a padding token changes no output at a non-padding position."
    torch.manual_seed(0)
    model = Transformer(replace(CFG, attn_fn=attn_fn, pos=pos, attn_init=1.0))
    x = tokens(2, 8)
    pm = torch.zeros(2, 8, dtype=torch.bool); pm[:, :3] = True  # left padding
    y = x.clone(); y[:, :3] = (x[:, :3] + 3) % 11
    with torch.no_grad():
        a, b = model(x, padding_mask=pm), model(y, padding_mask=pm)
    assert torch.isfinite(a).all()
    assert (a[:, 3:] - b[:, 3:]).abs().max() == 0.0


def _fine_pair(mlp_std, mlp_spl, attn_std="softmax", attn_spl="spline", **kw):
    fine = dict(n_knots=4001, spline_range=10.0, attn_init="exp", mlp_init="gelu")
    torch.manual_seed(0); a = Transformer(replace(CFG, mlp_act=mlp_std, attn_fn=attn_std, **fine, **kw))
    torch.manual_seed(0); b = Transformer(replace(CFG, mlp_act=mlp_spl, attn_fn=attn_spl, **fine, **kw))
    return a, b


@pytest.mark.parametrize("pos", POSITIONS)
def test_exp_attention_spline_reproduces_softmax_model(pos):
    a, b = _fine_pair("gelu", "gelu", pos=pos)
    with torch.no_grad(): d = (a(tokens()) - b(tokens())).abs().max()
    assert d < 5e-5, d


def test_gelu_mlp_spline_reproduces_gelu_model():
    a, b = _fine_pair("gelu", "spline", attn_spl="softmax")
    with torch.no_grad(): d = (a(tokens()) - b(tokens())).abs().max()
    assert d < 5e-5, d
    # and the gated variant: a spline initialised to silu in the gate reproduces SwiGLU
    fine = dict(n_knots=4001, spline_range=10.0, mlp_init=F.silu, attn_fn="softmax")
    torch.manual_seed(0); s = Transformer(replace(CFG, mlp_act="swiglu", **fine))
    torch.manual_seed(0); g = Transformer(replace(CFG, mlp_act="glu_spline", **fine))
    with torch.no_grad(): d = (s(tokens()) - g(tokens())).abs().max()
    assert d < 5e-5, d


@pytest.mark.parametrize("mlp_act", MLP_ACTS)
def test_every_mlp_act_trains(mlp_act):
    "Every MLP activation trains: 30 Adam steps on the weights (the activation fixed, as in Phase II) halve the loss on one batch."
    torch.manual_seed(0)
    model = Transformer(replace(CFG, mlp_act=mlp_act, mlp_init="gelu"))
    x = tokens(4, 10)
    opt = torch.optim.Adam(model.weight_parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, 11), x[:, 1:].reshape(-1))
        opt.zero_grad(); loss.backward(); opt.step()
        losses.append(float(loss))
    assert all(p.grad is not None for p in model.weight_parameters())
    assert all(math.isfinite(l) for l in losses) and losses[-1] < 0.5 * losses[0], (mlp_act, losses[0], losses[-1])


def test_bad_options_name_the_valid_ones():
    for field, bad, valid in [("mlp_act", "tanh", "glu_spline"), ("attn_fn", "sigmoid", "hardmax"),
                              ("pos", "rope", "sinusoidal"), ("sharing", "all", "per_layer"),
                              ("norm", "batchnorm", "rmsnorm"), ("extrapolate", "zero", "constant")]:
        with pytest.raises(ValueError, match=valid):
            replace(CFG, **{field: bad})
    with pytest.raises(ValueError, match="detach"):
        Transformer(CFG)(tokens(), detach="splines")


def test_detach_routes_gradients_in_a_single_model():
    torch.manual_seed(0)
    model = Transformer(CFG)
    x = tokens()
    for detach, want_w, want_s in [(None, True, True), ("nonlinearities", True, False), ("weights", False, True)]:
        model.zero_grad(set_to_none=True)
        out = model(x, detach=detach)
        out.square().mean().backward()
        assert any(p.grad is not None for p in model.weight_parameters()) == want_w, detach
        assert any(p.grad is not None for p in model.nonlinearities.parameters()) == want_s, detach
    with torch.no_grad():
        assert torch.equal(model(x, detach="weights"), model(x))


@pytest.mark.parametrize("sharing", SHARINGS)
def test_sharing_counts_and_layout(sharing):
    cfg = replace(CFG, n_layers=5, sharing=sharing)
    nl = Transformer(cfg).nonlinearities
    n = {"shared": 1, "per_layer": 5, "ends": 3}[sharing]
    assert len(nl.mlp) == n and len(nl.attn) == n
    assert {id(nl.mlp_phi(l)) for l in range(5)} == {id(s) for s in nl.mlp}


@pytest.mark.parametrize("sharing", SHARINGS)
def test_save_load_roundtrip_and_depth_transfer(tmp_path, sharing):
    cfg = replace(CFG, n_layers=3, sharing=sharing)
    torch.manual_seed(0)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.nonlinearities.parameters(): p.add_(torch.randn_like(p))
    path = model.nonlinearities.save(tmp_path / "nl")
    other = Transformer(cfg).load_nonlinearities(path)
    x = tokens()
    with torch.no_grad():
        other.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("nonlinearities.")}, strict=False)
        assert torch.equal(other(x), model(x))
    assert other.nonlinearities.frozen
    for L in (1, 2, 6):
        deep = Transformer(replace(cfg, n_layers=L)).load_nonlinearities(path)
        assert deep.nonlinearities.n_layers == L
        # first layer keeps the first layer's functions, last layer the last layer's
        z = torch.linspace(-3, 3, 7)
        assert torch.equal(deep.nonlinearities.mlp_phi(0)(z), model.nonlinearities.mlp_phi(0)(z))
        if L > 1: assert torch.equal(deep.nonlinearities.mlp_phi(L - 1)(z), model.nonlinearities.mlp_phi(2)(z))


def test_load_errors_are_clear(tmp_path):
    model = Transformer(CFG)
    path = model.nonlinearities.save(tmp_path / "nl")
    with pytest.raises(ValueError, match="n_knots"):
        Transformer(replace(CFG, n_knots=32)).load_nonlinearities(path)
    with pytest.raises(ValueError, match="but these nonlinearities have none"):
        Transformer(replace(CFG, attn_fn="softmax", mlp_act="gelu")).nonlinearities.save(tmp_path / "none")
        Transformer(CFG).load_nonlinearities(tmp_path / "none.safetensors")
    with pytest.raises(FileNotFoundError):
        Nonlinearities.load(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"; bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="corrupt"):
        Nonlinearities.load(bad)
    from safetensors.torch import save_file
    save_file({"mlp.0": torch.zeros(3)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(ValueError, match="config"):
        Nonlinearities.load(tmp_path / "foreign.safetensors")
    nan = Transformer(CFG).nonlinearities
    with torch.no_grad(): nan.mlp[0].values[3] = float("nan")
    p = nan.save(tmp_path / "nan")
    with pytest.raises(ValueError, match="non-finite"):
        Nonlinearities.load(p)


def test_generate_greedy_and_sampled():
    torch.manual_seed(0)
    model = Transformer(replace(CFG, pos="learned"))
    prompt = tokens(2, 5)
    out = model.generate(prompt, 10, temperature=0)        # runs past max_len=12: the context is cropped
    assert out.shape == (2, 15) and torch.equal(out[:, :5], prompt)
    with torch.no_grad():
        assert torch.equal(out[:, 5], model(prompt)[:, -1].argmax(-1))
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert torch.equal(model.generate(prompt, 4, temperature=0.8, generator=g1), model.generate(prompt, 4, temperature=0.8, generator=g2))
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 1, temperature=-1)


def test_summary_and_param_groups():
    model = Transformer(CFG)
    s = repr(model)
    assert "\n" not in s and "2 layers" in s and "spline" in s
    groups = model.param_groups(0.1, include_nonlinearities=True)
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0 and groups[2]["weight_decay"] == 0
    assert {id(p) for p in groups[2]["params"]} == {id(p) for p in model.nonlinearities.parameters()}
    assert sum(p.numel() for g in groups[:2] for p in g["params"]) == model.n_params()


def test_bf16_autocast_on_cpu():
    "Under CPU bf16 autocast the model runs in bf16 (logits are bf16), stays close to fp32, and its gradients are finite."
    torch.manual_seed(0)
    model = Transformer(CFG)
    with torch.no_grad(): ref = model(tokens())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(tokens())
    assert out.dtype == torch.bfloat16 and ref.dtype == torch.float32
    err = float((out.float() - ref).abs().max()); scale = float(ref.abs().max())
    assert err < 0.05 * scale, (err, scale)   # bf16 keeps ~3 significant digits
    out.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


# ---------------------------------------------------------------- ensemble
@pytest.mark.parametrize("variant", [
    dict(),
    dict(pos="learned", mlp_act="glu_spline", sharing="per_layer", tie_embeddings=False),
    dict(pos="sinusoidal", attn_fn="softmax", mlp_act="gelu", norm="layernorm", bias=False),
    dict(pos="none", attn_fn="hardmax", mlp_act="swiglu"),
])
def test_ensemble_equals_separate_models_through_adamw(variant, kernel):
    cfg = replace(CFG, **variant)
    seeds = [3, 5, 7]
    ens = Ensemble(cfg, seeds=seeds)
    singles = []
    for s in seeds:
        torch.manual_seed(s); singles.append(Transformer(cfg, nonlinearities=ens.nonlinearities))
    for m, t in enumerate(singles):
        for n, p in t.weight_named_parameters(): assert torch.equal(ens.weight(n)[m], p), n
    opt_e = torch.optim.AdamW(ens.param_groups(0.1), lr=3e-3)
    opt_s = [torch.optim.AdamW(t.param_groups(0.1), lr=3e-3) for t in singles]
    g = torch.Generator().manual_seed(0)
    for step in range(5):
        x = torch.randint(0, cfg.vocab_size, (3, 4, 10), generator=g)
        pm = torch.zeros(3, 4, 9, dtype=torch.bool); pm[:, 0, :2] = True
        ens.zero_grad(); [t.zero_grad() for t in singles]
        le = per_model_loss(ens(x[..., :-1], padding_mask=pm), x[..., 1:])
        le.sum().backward()
        for m, t in enumerate(singles):
            ls = F.cross_entropy(t(x[m, :, :-1], padding_mask=pm[m]).reshape(-1, cfg.vocab_size), x[m, :, 1:].reshape(-1))
            assert abs(ls.item() - le[m].item()) < 1e-5, (step, m)
            ls.backward()
            for n, p in t.weight_named_parameters():
                assert (ens.weight(n).grad[m] - p.grad).abs().max() < 1e-5, (step, m, n)
        opt_e.step(); [o.step() for o in opt_s]


def test_ensemble_seeds_rule_and_rng_untouched():
    torch.manual_seed(123); before = torch.rand(1)
    torch.manual_seed(123); Ensemble(CFG, n_models=2); after = torch.rand(1)
    assert torch.equal(before, after)
    ens = Ensemble(CFG, n_models=2)
    torch.manual_seed(1); t = Transformer(CFG)
    for n, p in t.weight_named_parameters(): assert torch.equal(ens.weight(n)[1], p)
    with pytest.raises(ValueError, match="one seed per model"):
        Ensemble(CFG, n_models=3, seeds=[1, 2])


@pytest.mark.parametrize("cfg", [CFG, replace(CFG, mlp_act="spline", attn_fn="spline", pre_qkv_spline=True, sharing="per_layer"),
                                 replace(CFG, mlp_act="glu_spline", sharing="ends", n_layers=3)], ids=["standard", "splines", "glu_ends"])
def test_ensemble_builds_one_spline_set_and_the_old_weights(cfg, monkeypatch):
    "Issue 24: an ensemble builds its splines once (or takes them), and its weights are bit for bit those of M separately built models, as before."
    seeds = [4, 100, 7]
    old = []   # the old construction: each model its own Transformer(cfg), with a spline set of its own
    for s in seeds:
        torch.manual_seed(s); old.append(Transformer(cfg))
    built = []
    init = Nonlinearities.__init__
    monkeypatch.setattr(Nonlinearities, "__init__", lambda self, *a, **kw: (built.append(1), init(self, *a, **kw))[1])
    torch.manual_seed(9); ens = Ensemble(cfg, seeds=seeds); after = torch.rand(1)
    assert len(built) == 1   # one set for M models
    torch.manual_seed(9); assert torch.equal(torch.rand(1), after)   # the caller's random stream is untouched
    shared = Nonlinearities.from_config(cfg); built.clear()
    given = Ensemble(cfg, seeds=seeds, nonlinearities=shared)
    assert built == [] and given.nonlinearities is shared
    for m, t in enumerate(old):
        for n, p in t.weight_named_parameters():
            assert torch.equal(ens.weight(n)[m], p) and torch.equal(given.weight(n)[m], p), (m, n)
    for a, b in zip(ens.nonlinearities.parameters(), old[0].nonlinearities.parameters()): assert torch.equal(a, b)


@pytest.mark.parametrize("mlp_act", ["spline", "glu_spline", "gelu"])
def test_recorders_see_the_same_in_an_ensemble_as_in_its_models(mlp_act):
    "Issue 24: `record_preactivations` and `record_scores` are the public hooks a probe uses; through an ensemble they see what each model sees."
    cfg = replace(CFG, mlp_act=mlp_act)
    ens, x = Ensemble(cfg, seeds=[1, 2]), torch.randint(0, CFG.vocab_size, (2, 3, 8))
    def watch(f, *a):
        seen = {"mlp": [], "attn": []}
        with torch.no_grad(), record_preactivations(seen["mlp"].append), record_scores(seen["attn"].append): out = f(*a)
        return out, seen
    with torch.no_grad(): plain = ens(x)
    out, e = watch(ens, x)
    assert torch.equal(out, plain)   # watching changes nothing
    H, T = cfg.n_heads, 8
    for m in range(2):
        _, t = watch(ens.extract(m), x[m])
        assert len(t["mlp"]) == len(t["attn"]) == len(e["mlp"]) == len(e["attn"]) == cfg.n_layers
        for l in range(cfg.n_layers):
            assert t["mlp"][l].shape == (3, T, cfg.hidden) and torch.allclose(e["mlp"][l][m], t["mlp"][l], atol=1e-5)
            assert torch.allclose(e["attn"][l].view(2, 3, H, T, T)[m], t["attn"][l], atol=1e-5)
    assert all(torch.isfinite(s).all() for s in e["attn"])   # the scores before the mask: finite everywhere
    with torch.no_grad(): ens(x)
    assert len(e["mlp"]) == len(e["attn"]) == cfg.n_layers   # nothing is recorded outside the block


def test_ensemble_detach_and_param_groups():
    ens = Ensemble(CFG, n_models=2)
    x = tokens(2, 8)
    for detach, want_w, want_s in [("nonlinearities", True, False), ("weights", False, True)]:
        ens.zero_grad(set_to_none=True)
        ens(x, detach=detach).square().mean().backward()
        assert any(p.grad is not None for p in ens.weight_parameters()) == want_w
        assert any(p.grad is not None for p in ens.nonlinearities.parameters()) == want_s
    decay, no_decay = ens.param_groups(0.1)
    assert all(p.dim() >= 3 for p in decay["params"]) and all(p.dim() < 3 for p in no_decay["params"])
    spl = {id(p) for p in ens.nonlinearities.parameters()}
    assert not spl & {id(p) for g in (decay, no_decay) for p in g["params"]}


def test_extract_and_from_models_roundtrip():
    ens = Ensemble(CFG, n_models=3)
    x = torch.randint(0, 11, (3, 2, 8))
    with torch.no_grad():
        out = ens(x)
        for m in range(3):
            t = ens.extract(m)
            assert t.nonlinearities is ens.nonlinearities
            assert torch.allclose(t(x[m]), out[m], atol=1e-5)
        back = Ensemble.from_models([ens.extract(m) for m in range(3)])
        assert torch.allclose(back(x), out, atol=1e-6)
    other = Transformer(CFG)
    with torch.no_grad(): other.nonlinearities.mlp[0].values.add_(1.0)
    with pytest.raises(ValueError, match="different spline values"):
        Ensemble.from_models([ens.extract(0), other])


# ---------------------------------------------------------------- issue 14: nothing lost, nothing silent
@pytest.mark.parametrize("change, message", [
    (dict(n_knots=1), "n_knots"), (dict(n_knots=2.5), "n_knots"), (dict(n_knots=True), "n_knots"),
    (dict(attn_n_knots=1), "attn_n_knots"), (dict(spline_range=float("inf")), "spline_range"),
    (dict(spline_range=float("nan")), "spline_range"), (dict(spline_range=0.0), "spline_range"),
    (dict(attn_spline_range=float("inf")), "attn_spline_range"), (dict(mlp_init="tanh"), "mlp_init"),
    (dict(attn_init="softmax"), "attn_init"), (dict(mlp_init=float("nan")), "mlp_init"),
    (dict(dropout="0.1"), "dropout"), (dict(vocab_size=0), "vocab_size"), (dict(d_mlp=2.0), "d_mlp"),
    (dict(bias="yes"), "bias"), (dict(tie_embeddings=1), "tie_embeddings"),
])
def test_config_is_validated_when_made(change, message):
    "Every bad setting is a one-line ValueError naming the field when the config is made, not when the model is built."
    with pytest.raises(ValueError, match=message):
        replace(CFG, **change)


def test_config_accepts_numpy_and_tensor_integers():
    import json, numpy as np
    cfg = replace(CFG, vocab_size=np.int64(11), n_layers=torch.tensor(2), n_knots=np.int32(16), spline_range=np.float32(4.0))
    assert type(cfg.vocab_size) is int and type(cfg.n_layers) is int and type(cfg.n_knots) is int
    assert type(cfg.spline_range) is float
    json.dumps(cfg.to_dict())                       # numpy scalars would not serialise
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    replace(CFG, mlp_init=torch.tanh, attn_init="exp")   # callables and known names stay allowed


@pytest.mark.parametrize("make", [lambda: Transformer(CFG), lambda: Ensemble(CFG, n_models=2)])
def test_token_ids_are_checked(make):
    model = make()
    x = tokens()
    for bad, message in [(x.float(), "integer"), (x.bool(), "integer"), (x.clone().fill_(11), r"\[0, 11\)"),
                         (x.clone().fill_(-1), r"\[0, 11\)")]:
        with pytest.raises(ValueError, match=message):
            model(bad)
    with torch.no_grad():
        ref = model(x)
        for dt in (torch.int32, torch.int16, torch.uint8):
            assert torch.equal(model(x.to(dt)), ref), dt


def test_concurrent_nonlinearities_saves_never_crash(tmp_path):
    import threading
    nls = [Transformer(replace(CFG, mlp_init=i)).nonlinearities for i in ("gelu", "relu", "identity")]
    path, errors = tmp_path / "nl.safetensors", []
    def writer(nl):
        try:
            for _ in range(100): nl.save(path)
        except Exception as e: errors.append(e)
    threads = [threading.Thread(target=writer, args=(nl,)) for nl in nls]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors, errors
    back = Nonlinearities.load(path)
    assert any(torch.equal(back.mlp[0].values, nl.mlp[0].values) for nl in nls)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nl.json", "nl.safetensors"]


def test_nonlinearities_checksum(tmp_path):
    from safetensors import safe_open
    p = Transformer(CFG).nonlinearities.save(tmp_path / "nl")
    with safe_open(str(p), framework="pt") as f: assert len(f.metadata()["sha256"]) == 64
    data = bytearray(p.read_bytes()); data[-4] ^= 0x01; p.write_bytes(bytes(data))   # a tiny, finite change
    with pytest.raises(ValueError, match=r"nl\.safetensors.*checksum"):
        Nonlinearities.load(p)


def test_spline_attention_scores_are_float32_under_autocast():
    "Under bf16 autocast the spline sees the float32 scores, not a bf16 matmul cast up afterwards."
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 7, 8) for _ in range(3))
    spline = LinearSpline(16, -4.0, 4.0, init="exp")
    seen = []
    def phi(s): seen.append(s.detach().clone()); return spline(s)
    want = (q @ k.transpose(-2, -1)) / 8 ** 0.5
    for fn in ("spline", "hardmax"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            attend(q, k, v, fn, phi=phi)
            w = attention_weights(q, k, fn, phi=phi)
    assert len(seen) == 2 and all(s.dtype == torch.float32 for s in seen)
    for s in seen: torch.testing.assert_close(s, want, rtol=1e-5, atol=1e-5)   # a bf16 matmul is off by ~1e-2
    # hardmax picks the float32 maximum: its weights equal those computed without autocast
    torch.testing.assert_close(w, attention_weights(q, k, "hardmax"))


def test_generate_arguments_are_checked():
    import numpy as np
    model = Transformer(replace(CFG, pos="learned"))
    prompt = tokens(1, 4)
    assert model.generate(prompt, np.int64(2), temperature=0).shape == (1, 6)
    for kw, message in [(dict(max_new_tokens=2.5), "max_new_tokens"), (dict(max_new_tokens=-1), "max_new_tokens"),
                        (dict(max_new_tokens=2, top_k=0), "top_k"), (dict(max_new_tokens=2, temperature=float("nan")), "temperature")]:
        with pytest.raises(ValueError, match=message):
            model.generate(prompt, **kw)


def test_config_for_takes_the_spline_layout_from_the_splines():
    "A model for saved splines gets their layout from `Nonlinearities.config_for`; only `model` reads a Nonlinearities' settings."
    from pathlib import Path
    saved = Nonlinearities.from_config(replace(CFG, mlp_act="spline", attn_fn="softmax", n_knots=41, spline_range=6.0, sharing="per_layer"))
    got = saved.config_for(TransformerConfig(vocab_size=11, n_layers=3, d_model=16, n_heads=2))
    assert (got.mlp_act, got.attn_fn, got.n_knots, got.spline_range, got.sharing, got.n_layers) == ("spline", "softmax", 41, 6.0, "per_layer", 3)
    both = Nonlinearities.from_config(replace(CFG, n_knots=9, spline_range=3.0, attn_n_knots=7, attn_spline_range=2.0))
    g2 = both.config_for(TransformerConfig(vocab_size=11, d_model=16, n_heads=2))
    assert (g2.attn_fn, g2.n_knots, g2.attn_n_knots, g2.attn_spline_range) == ("spline", 9, 7, 2.0)
    Transformer(g2).load_nonlinearities(both.for_depth(g2.n_layers))   # the layouts agree
    pkg = Path(__file__).resolve().parents[1] / "spline_transformers"
    readers = [f.name for f in sorted(pkg.glob("*.py")) if not f.name.startswith("_") and ".settings" in f.read_text()]
    assert readers == ["model.py"], readers


def test_one_switch_and_one_vocabulary_for_spline_and_attention_backends(monkeypatch):
    "$SPLINE_TRANSFORMERS_BACKEND chooses for splines and attention alike; set_attention_backend overrides it for attention."
    from spline_transformers.splines import BackendChoice, ENV_BACKEND
    monkeypatch.setenv(ENV_BACKEND, "torch")
    import spline_transformers.attention as A
    monkeypatch.setitem(A._kernel_state, "requested", None)    # nothing chosen in this process yet: the variable decides
    try:
        assert isinstance(attention_backend(), BackendChoice)
        assert attention_backend().name == "torch" and ENV_BACKEND in attention_backend().reason
        set_attention_backend("cpp")
        assert attention_backend().name in ("cpp", "torch")   # torch only where the kernel cannot be built (reason given)
        with pytest.raises(ValueError, match="unknown attention backend 'fast'; valid values are 'auto', 'cpp', 'torch'"):
            set_attention_backend("fast")
    finally:
        set_attention_backend("auto")


# ---------------------------------------------------------------- other forms of a learned spline
from hypothesis import given, strategies as st
from spline_transformers.model import smooth_values, symmetrise_values


@given(seed=st.integers(0, 10_000), noise=st.floats(0.0, 0.3), degree=st.sampled_from([8, 16, 24, 32]))
def test_a_polynomial_activation_stays_within_its_fit_error_of_the_spline(seed, noise, degree):
    "Inside a model the polynomial form differs from the spline by at most the fit's own max error, everywhere (constant outside the range)."
    nl = Nonlinearities(2, "per_layer", mlp=dict(n_knots=41, x_min=-6.0, x_max=6.0, init="gelu", extrapolate="constant"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for s in nl.mlp: s.values.add_(noise * torch.randn(41, generator=g))
    poly = nl.to_polynomial(degree)
    x = torch.linspace(-9, 9, 3001)
    for layer in range(2):
        with torch.no_grad(): gap = (poly.mlp_phi(layer)(x) - nl.mlp_phi(layer)(x)).abs().max().item()
        assert gap <= poly.mlp_polynomials[layer].max_error * 1.05 + 1e-5, (layer, gap)
    assert poly.frozen and poly.polynomial_degree == degree and nl.polynomial_degree is None


def test_polynomial_and_cleaned_forms_refuse_what_they_cannot_do():
    lin = Nonlinearities(1, mlp=dict(n_knots=9, x_min=-3.0, x_max=3.0, init="gelu", extrapolate="linear"))
    with pytest.raises(ValueError, match="extrapolate"): lin.to_polynomial(8)
    with pytest.raises(ValueError, match="no MLP spline"): Nonlinearities(1, attn=dict(n_knots=9, init="exp")).to_polynomial(8)
    with pytest.raises(ValueError, match="unknown cleaning"): lin.cleaned("smooth")
    with pytest.raises(ValueError, match="unknown form"): lin.in_form("polynomial:x")


def test_cleanings_keep_what_they_should():
    "Smoothing keeps a straight line; symmetrising keeps any even function plus a line, and removes an odd cubic's curvature."
    x = torch.linspace(-6, 6, 41)
    line = 0.5 * x + 1
    torch.testing.assert_close(smooth_values(line, 2.0)[10:31], line[10:31], atol=1e-5, rtol=0)   # the interior (ends are renormalised)
    even_plus_line = x ** 2 / 10 + 0.3 * x
    torch.testing.assert_close(symmetrise_values(even_plus_line, x), even_plus_line, atol=1e-5, rtol=0)
    cubic = symmetrise_values(x ** 3 / 50, x)
    torch.testing.assert_close(cubic.diff().diff(), torch.zeros(39), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- issue 27: the authors' (lm-afs) splines and the pre-QKV spline
from spline_transformers.model import read_afs_csv, write_afs_csv, PreQKVSpline
import numpy as np
from pathlib import Path

AFS = Path(__file__).resolve().parents[1] / "spline_transformers" / "zoo" / "lm-afs"
AFS_FILES = sorted(AFS.glob("*.csv"))


def _afs_pairs(f):
    "(anchors, values) float64 pairs parsed independently of the package."
    lines = [l for l in f.read_text().splitlines() if l.strip()]
    return [(np.array(a.split(","), dtype=np.float64), np.array(v.split(","), dtype=np.float64)) for a, v in zip(lines[0::2], lines[1::2])]


def test_afs_files_are_shipped_with_their_licence():
    assert len(AFS_FILES) == 3 and (AFS / "LICENSE").read_text().startswith("MIT License")
    assert "idiap/lm-afs" in (AFS / "README.md").read_text()


@pytest.mark.parametrize("f", AFS_FILES, ids=lambda f: f.stem)
def test_afs_splines_evaluate_as_their_definition(f):
    "Every spline of every file: the book's evaluation vs np.interp (linear, constant beyond the ends) on 10⁶ points over ±20."
    nl, pairs = read_afs_csv(f), _afs_pairs(f)
    splines = [nl.mlp_phi(l) for l in range(4)] + [nl.pre_qkv[nl.layout[l]] for l in range(4) if len(nl.pre_qkv)]
    assert len(splines) == len(pairs) and len(pairs) in (4, 8)
    x = torch.linspace(-20, 20, 1_000_000, dtype=torch.float64)
    worst = 0.0
    with torch.no_grad():
        for s, (a, v) in zip(splines, pairs):
            assert s.extrapolate == "constant" and (s.x_min, s.x_max, s.n_knots) == (-15.0, 15.0, 64)
            err = np.abs(s(x).numpy() - np.interp(x.numpy(), a, v)).max() / np.abs(v).max()
            worst = max(worst, err)
            assert err <= 1e-6, err
    print(f"{f.name}: largest error / largest |value| = {worst:.2e}")


@pytest.mark.parametrize("f", AFS_FILES, ids=lambda f: f.stem)
def test_afs_round_trips(f, tmp_path):
    "Read then write their file: the same values (same text) and anchors within one float32 step; write then read: bit for bit."
    nl = read_afs_csv(f)
    out = write_afs_csv(nl, tmp_path / "out.csv")
    theirs, ours = f.read_text().splitlines(), out.read_text().splitlines()
    assert len(ours) == len(theirs) and ours[1::2] == theirs[1::2]
    for a, b in zip(theirs[0::2], ours[0::2]):
        assert np.abs(np.array(a.split(","), dtype=np.float64) - np.array(b.split(","), dtype=np.float64)).max() <= 1e-6
    back = read_afs_csv(out)
    assert back.sharing == nl.sharing
    for (n, p), (m, q) in zip(nl.named_parameters(), back.named_parameters()):
        assert n == m and torch.equal(p, q), n
    # our learned splines (random values, per layer) survive write then read bit for bit
    torch.manual_seed(0)
    mine = Nonlinearities(4, "per_layer", mlp=dict(n_knots=64, init="gelu"), pre_qkv=dict(n_knots=64, init=0.01))
    with torch.no_grad():
        for s in list(mine.mlp) + list(mine.pre_qkv): s.values.mul_(torch.randn(64) * 37.3)
    again = read_afs_csv(write_afs_csv(mine, tmp_path / "mine.csv"))
    for a, b in zip(list(mine.mlp) + list(mine.pre_qkv), list(again.mlp) + list(again.pre_qkv)): assert torch.equal(a.values, b.values)


def test_afs_refuses_uneven_anchors_and_bad_files(tmp_path):
    lines = AFS_FILES[0].read_text().splitlines()
    a = lines[2].split(","); a[10] = str(float(a[10]) + 0.01); bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines[:2] + [",".join(a)] + lines[3:]) + "\n")
    with pytest.raises(ValueError, match=r"bad\.csv, line 3: the anchors are not evenly spaced") as e: read_afs_csv(bad)
    assert "\n" not in str(e.value)
    bad.write_text("\n".join(lines[:5]) + "\n")
    with pytest.raises(ValueError, match="5 lines"): read_afs_csv(bad)
    bad.write_text("\n".join(lines[:3] + ["1,2,x"] + lines[4:]) + "\n")
    with pytest.raises(ValueError, match="line 4: not a comma-separated"): read_afs_csv(bad)
    with pytest.raises(ValueError, match="score-kernel"): write_afs_csv(Nonlinearities.from_config(CFG), tmp_path / "x.csv")
    pq = read_afs_csv(AFS_FILES[-1])
    with torch.no_grad(): pq.pre_qkv[0].a.fill_(2.0)
    with pytest.raises(ValueError, match="pre-QKV scalars"): write_afs_csv(pq, tmp_path / "x.csv")


PQ = replace(CFG, attn_fn="softmax", pos="learned", pre_qkv_spline=True, sharing="per_layer", mlp_init=0.01)


def test_pre_qkv_spline_is_off_by_default_and_absent_from_to_dict():
    assert "pre_qkv_spline" not in CFG.to_dict() and TransformerConfig.from_dict(CFG.to_dict()) == CFG
    assert PQ.to_dict()["pre_qkv_spline"] is True and TransformerConfig.from_dict(PQ.to_dict()) == PQ
    assert "pre_qkv" not in Nonlinearities.from_config(CFG).config()   # files saved without it keep their bytes
    with pytest.raises(ValueError, match="pre_qkv_spline"): replace(CFG, pre_qkv_spline=1)


def test_pre_qkv_spline_changes_the_model_as_its_formula_says():
    "With φ = 0 and any a, b the model is the plain one; moving φ moves the logits; x + φ(a·x + b) is what a layer applies."
    torch.manual_seed(0)
    m = Transformer(PQ)
    plain = Transformer(replace(PQ, pre_qkv_spline=False), nonlinearities=m.nonlinearities); plain.load_state_dict(m.state_dict(), strict=False)
    x = torch.randint(0, PQ.vocab_size, (2, 7))
    with torch.no_grad():
        for s in m.nonlinearities.pre_qkv: s.values.zero_(); s.a.fill_(3.0); s.b.fill_(-1.0)
        torch.testing.assert_close(m(x), plain(x), rtol=0, atol=0)
        s = m.nonlinearities.pre_qkv[1]; s.values.copy_(torch.linspace(-2, 2, 64))
        assert (m(x) - plain(x)).abs().max() > 1e-3
        h = torch.randn(5, dtype=torch.float64)
        want = h + torch.from_numpy(np.interp(3.0 * h.numpy() - 1.0, s.knots.double().numpy(), s.values.double().numpy()))
        torch.testing.assert_close(m.nonlinearities.pre_qkv_phi(1)(h), want, rtol=0, atol=1e-6)


def test_pre_qkv_spline_learns_values_and_scalars_and_detaches():
    torch.manual_seed(0)
    m = Transformer(PQ)
    with torch.no_grad():   # a constant spline has slope 0, so a and b would get no gradient
        for s in m.nonlinearities.pre_qkv: s.values.copy_(torch.randn(64))
    x = torch.randint(0, PQ.vocab_size, (2, 7))
    m(x).square().mean().backward()
    for s in m.nonlinearities.pre_qkv:
        assert s.values.grad.abs().sum() > 0 and s.a.grad is not None and s.a.grad != 0 and s.b.grad != 0
    m.zero_grad(set_to_none=True)
    m(x, detach="nonlinearities").square().mean().backward()
    assert all(p.grad is None for p in m.nonlinearities.parameters())
    assert m.load_nonlinearities(m.nonlinearities).nonlinearities.frozen   # Phase II: frozen


@pytest.mark.parametrize("sharing", ["shared", "per_layer"])
def test_pre_qkv_ensemble_equals_transformer(sharing):
    "The batched Ensemble and a Transformer with the same weights and splines give identical logits and spline gradients."
    cfg = replace(PQ, sharing=sharing)
    ens = Ensemble(cfg, seeds=[1, 2])
    with torch.no_grad():
        for s in ens.nonlinearities.pre_qkv: s.values.copy_(torch.randn(64)); s.a.fill_(0.7); s.b.fill_(0.2)
    x = torch.randint(0, cfg.vocab_size, (2, 3, 6))
    le = ens(x)
    for m in range(2):
        t = ens.extract(m)
        assert torch.equal(t(x[m]), le[m]), m
    le[0].sum().backward()
    g = [p.grad.clone() for p in ens.nonlinearities.parameters()]
    ens.zero_grad(); ens.extract(0)(x[0]).sum().backward()
    for a, b in zip(g, ens.nonlinearities.parameters()): torch.testing.assert_close(a, b.grad, rtol=1e-5, atol=1e-6)


def test_pre_qkv_saves_loads_and_old_files_still_load(tmp_path):
    torch.manual_seed(0)
    nl = Nonlinearities.from_config(PQ)
    with torch.no_grad():
        for s in nl.pre_qkv: s.values.copy_(torch.randn(64)); s.a.fill_(1.5); s.b.fill_(-0.25)
    back = Nonlinearities.load(nl.save(tmp_path / "pq"))
    for (n, p), (m, q) in zip(nl.named_parameters(), back.named_parameters()): assert n == m and torch.equal(p, q), n
    deeper = nl.for_depth(4)
    assert [s.a.item() for s in deeper.pre_qkv] == [1.5] * 4 and torch.equal(deeper.pre_qkv[3].values, nl.pre_qkv[1].values)
    assert nl.config_for(replace(PQ, pre_qkv_spline=False)) == PQ
    # a file written before the pre-QKV spline existed (the shipped zoo) loads, with none
    old = Path(__file__).resolve().parents[1] / "spline_transformers" / "zoo" / "add-mlp-attn.safetensors"
    o = Nonlinearities.load(old)
    assert len(o.pre_qkv) == 0 and len(o.mlp) and "pre_qkv" not in o.config()
    assert Nonlinearities.load(o.save(tmp_path / "old")).config() == o.config()
    # the authors' attention splines load into a model with pre_qkv_spline=True
    afs = read_afs_csv(AFS / "ptAf-optimizedMlpAtt-layerSpecific-phase1-step20000.csv")
    cfg = afs.config_for(TransformerConfig(vocab_size=50, n_layers=4, d_model=16, n_heads=2, max_len=8))
    assert cfg.pre_qkv_spline and cfg.mlp_act == "spline" and cfg.sharing == "per_layer"
    t = Transformer(cfg).load_nonlinearities(afs)
    assert t.nonlinearities.frozen and torch.isfinite(t(torch.randint(0, 50, (1, 8)))).all()
    with pytest.raises(ValueError, match="pre-QKV residual"): Transformer(replace(cfg, mlp_act="gelu", n_knots=32), nonlinearities=afs)
