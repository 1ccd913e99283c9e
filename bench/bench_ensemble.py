"""One training step of M=8 tiny transformers as a batched `Ensemble` against 8 sequential steps of separate
`Transformer`s (the same work: forward, per-model loss, backward, AdamW step). Tiny models as in
PERFORMANCE.md: d_model=64, 2 layers, T=32, batch 64 per model, vocab 65. Prints the speed-up measured in this
one run (rounds interleaved, medians), for the standard architecture and for the spline one (Phase I's case).
Not a test: timings on shared machines move by ±20-30%.

    python bench/bench_ensemble.py [--threads 2] [--rounds 15] [--M 8] [--compile]
"""
import argparse

import timing
timing.user_process()

import torch

from timing import CLOCK
import torch.nn.functional as F

from spline_transformers.model import TransformerConfig, Transformer
from spline_transformers.ensemble import Ensemble, per_model_loss


def make_steps(cfg, M, B, T, compile_):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (M, B, T + 1), generator=g)
    ens = Ensemble(cfg, n_models=M)
    opt_e = torch.optim.AdamW(ens.param_groups(0.1), lr=1e-3)
    models = [ens.extract(m) for m in range(M)]
    opts = [torch.optim.AdamW(t.param_groups(0.1), lr=1e-3) for t in models]
    fwd = torch.compile(ens) if compile_ else ens

    def batched():
        opt_e.zero_grad(set_to_none=True)
        per_model_loss(fwd(x[..., :-1], detach="nonlinearities"), x[..., 1:]).sum().backward()
        opt_e.step()

    def sequential():
        for m, (t, o) in enumerate(zip(models, opts)):
            o.zero_grad(set_to_none=True)
            F.cross_entropy(t(x[m, :, :-1], detach="nonlinearities").reshape(-1, cfg.vocab_size), x[m, :, 1:].reshape(-1)).backward()
            o.step()
    return batched, sequential


def main():
    ap = argparse.ArgumentParser()
    timing.add_timing_args(ap, rounds=15)
    ap.add_argument("--M", type=int, default=8)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of the ensemble forward")
    a = ap.parse_args()
    timing.start(a)
    B, T = 64, 32
    base = dict(vocab_size=65, n_layers=2, d_model=64, n_heads=4, max_len=T)
    archs = {"gelu/softmax": TransformerConfig(**base),
             "spline/spline": TransformerConfig(**base, mlp_act="spline", attn_fn="spline", attn_init="exp", mlp_init="gelu")}
    print(f"M={a.M} models, d_model=64, 2 layers, T={T}, batch {B} per model, {a.threads} threads; one training step "
          "(forward, loss, backward, AdamW) of the batched ensemble vs {M} sequential steps".replace("{M}", str(a.M)))
    for name, cfg in archs.items():
        variants = {"batched": make_steps(cfg, a.M, B, T, False)}
        if a.compile: variants["batched+compile"] = make_steps(cfg, a.M, B, T, True)
        runs = {"sequential": variants["batched"][1]}
        runs.update({k: v[0] for k, v in variants.items()})
        for r in runs.values(): r(); r(); r()  # warm up (and compile)
        times = {k: [] for k in runs}
        for _ in range(a.rounds):
            for k, r in runs.items():
                t0 = CLOCK[0](); r(); times[k].append(CLOCK[0]() - t0)
        med = {k: (min(v) if a.stat == 'min' else sorted(v)[len(v) // 2]) for k, v in times.items()}
        line = ", ".join(f"{k} {med[k] * 1e3:.1f} ms" for k in runs)
        speed = ", ".join(f"{k} {med['sequential'] / med[k]:.2f}x" for k in runs if k != "sequential")
        print(f"{name:<14} {line}  ->  speed-up {speed}")
    print("target (PERFORMANCE.md): >= 1.5x faster than the sequential loop")


if __name__ == "__main__":
    main()
