"""A training step (forward, loss, backward, AdamW) of a model with frozen splines (spline MLP + spline
attention kernel: Phase II) against the same model with GeLU and softmax attention (SDPA). Prints the ratio
measured in this one run (rounds interleaved, medians). Not a test: timings on shared machines move by ±20-30%.

    python bench/bench_frozen_spline.py [--threads 2] [--rounds 15] [--d 128] [--T 128] [--B 32]
"""
import argparse

import timing
timing.user_process()

import torch

from timing import CLOCK
import torch.nn.functional as F

from spline_transformers.model import TransformerConfig, Transformer
from spline_transformers.splines import spline_backend


def step_fn(cfg, x, freeze):
    torch.manual_seed(0)
    model = Transformer(cfg)
    if freeze: model.nonlinearities.freeze()
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=1e-3)
    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[:, :-1]).reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1)).backward()
        opt.step()
    return step


def main():
    ap = argparse.ArgumentParser()
    timing.add_timing_args(ap, rounds=15)
    ap.add_argument("--d", type=int, default=128); ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--T", type=int, default=128); ap.add_argument("--B", type=int, default=32)
    a = ap.parse_args()
    timing.start(a)
    base = dict(vocab_size=65, n_layers=a.layers, d_model=a.d, n_heads=4, max_len=a.T)
    x = torch.randint(0, 65, (a.B, a.T + 1), generator=torch.Generator().manual_seed(0))
    runs = {"gelu/softmax": step_fn(TransformerConfig(**base), x, False),
            "frozen spline/spline": step_fn(TransformerConfig(**base, mlp_act="spline", attn_fn="spline",
                                                              mlp_init="gelu", attn_init="exp"), x, True),
            "frozen spline mlp only": step_fn(TransformerConfig(**base, mlp_act="spline", mlp_init="gelu"), x, True)}
    for r in runs.values(): r(); r()
    times = {k: [] for k in runs}
    for _ in range(a.rounds):
        for k, r in runs.items():
            t0 = CLOCK[0](); r(); times[k].append(CLOCK[0]() - t0)
    med = {k: (min(v) if a.stat == 'min' else sorted(v)[len(v) // 2]) for k, v in times.items()}
    print(f"training step, d_model={a.d}, {a.layers} layers, 4 heads, T={a.T}, batch {a.B}, vocab 65, {a.threads} threads, "
          f"spline backend: {spline_backend('cpu').name}")
    for k in runs: print(f"{k:<24}{med[k] * 1e3:9.1f} ms  {med[k] / med['gelu/softmax']:.2f}x")
    print("target (PERFORMANCE.md): frozen-spline step <= 1.15x the GeLU/softmax step")


if __name__ == "__main__":
    main()
