"""Our `Transformer` against a nanoGPT-style reference (`nanogpt_ref.py`) at nanoGPT's README CPU configuration:
4 layers, 4 heads, width 128, context 64, batch 12, dropout 0, no biases, vocab 65 (character Shakespeare).

One training step each (forward, loss, backward, gradient clipping at 1.0, AdamW), measured side by side in one
process with rounds interleaved; the ratio is our median step time over the reference's (<= 1.0 means we are no
slower). Our steps are built from the trainer's own pieces (`forward_models`, `masked_cross_entropy`,
`clip_grad_norm_per_model_`, `train.make_optimizer`), so the ratio is what `train` pays. The reference's AdamW is
nanoGPT's on a CPU (decay groups, not fused). Prints the machine's load; not a test.

    python bench/bench_nanogpt.py [--threads 1] [--rounds 30] [--profile]
"""
import argparse

import timing
timing.user_process()

import torch
import torch.nn.functional as F

from timing import CLOCK
from nanogpt_ref import GPT, GPTConfig
from spline_transformers.model import TransformerConfig, Transformer
from spline_transformers.train import TrainConfig, forward_models, masked_cross_entropy, clip_grad_norm_per_model_
try: from spline_transformers.train import make_optimizer
except ImportError:   # the code before issue 17 (for before/after numbers): plain AdamW over the trainer's groups
    from spline_transformers.train import _param_groups
    def make_optimizer(model, cfg, groups=None):
        return torch.optim.AdamW(_param_groups(model, cfg) if groups is None else groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)

V, T, B, L, H, D = 65, 64, 12, 4, 4, 128


def ref_step():
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_embd=D, dropout=0.0, bias=False))
    opt = m.configure_optimizers(0.1, 1e-3, (0.9, 0.99))
    def step(x, y):
        c = CLOCK[0]
        t0 = c(); _, loss = m(x, y)
        t1 = c(); loss.backward()
        t2 = c(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step(); opt.zero_grad(set_to_none=True)
        return t1 - t0, t2 - t1, c() - t2
    return step


def our_step(mlp_act, attn_fn, **kw):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=V, n_layers=L, d_model=D, n_heads=H, max_len=T, mlp_act=mlp_act, attn_fn=attn_fn,
                            norm="layernorm", bias=False, dropout=0.0, tie_embeddings=True, **kw)
    m = Transformer(cfg).train()
    tc = TrainConfig(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, grad_clip=1.0)
    opt = make_optimizer(m, tc)
    ps = [p for g in opt.param_groups for p in g["params"]]
    def step(x, y):
        c = CLOCK[0]
        t0 = c(); loss = masked_cross_entropy(forward_models(m, x), y, torch.ones_like(y, dtype=torch.bool))
        opt.zero_grad(set_to_none=True)
        t1 = c(); loss.sum().backward()
        t2 = c(); clip_grad_norm_per_model_(ps, 1.0, 1)
        opt.step()
        return t1 - t0, t2 - t1, c() - t2
    return step


def main():
    ap = argparse.ArgumentParser()
    timing.add_timing_args(ap, rounds=30)
    ap.add_argument("--profile", action="store_true", help="also print each step's top operators (torch.profiler)")
    ap.set_defaults(threads=1, clock="cpu")   # 1 thread, process CPU time: steady on a busy machine
    a = ap.parse_args()
    timing.start(a)
    import spline_transformers; print(f"spline_transformers from {spline_transformers.__file__}")
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, V, (B, T + 1), generator=g)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    steps = {"nanoGPT-style reference": ref_step(),
             "Transformer gelu/softmax": our_step("gelu", "softmax"),
             "Transformer spline/softmax": our_step("spline", "softmax", mlp_init="gelu"),
             "Transformer spline/spline": our_step("spline", "spline", mlp_init="gelu", attn_init="exp")}
    for s in steps.values():
        for _ in range(3): s(x, y)
    parts = ("forward+loss", "backward", "clip+AdamW")
    times = {k: [] for k in steps}
    for _ in range(a.rounds):
        for k, s in steps.items(): times[k].append(s(x, y))
    med = lambda v: min(v) if a.stat == "min" else sorted(v)[len(v) // 2]
    total = {k: med([sum(t) for t in v]) for k, v in times.items()}
    part = {k: [med([t[i] for t in v]) for i in range(3)] for k, v in times.items()}
    ref = "nanoGPT-style reference"
    print(f"nanoGPT README CPU config: {L} layers, {H} heads, width {D}, context {T}, batch {B}, dropout 0, no biases; "
          f"{a.threads} thread(s), {a.rounds} interleaved rounds")
    print(f"  {'':<28} {'ms/step':>8} {'ratio':>6}   " + "  ".join(f"{p:>13}" for p in parts) + "   (part ratios to the reference)")
    for k in steps:
        pr = "  ".join(f"{1e3 * part[k][i]:6.2f} {part[k][i] / part[ref][i]:5.2f}x" for i in range(3))
        print(f"  {k:<28} {1e3 * total[k]:8.2f} {total[k] / total[ref]:5.2f}x   {pr}")
    print("targets: gelu/softmax <= 1.0x, spline MLP (spline/softmax) <= 1.1x the reference's step")
    if a.profile:
        for k, s in steps.items():
            with torch.profiler.profile() as prof:
                for _ in range(5): s(x, y)
            print(f"\n{k}: top operators over 5 steps")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50))
    import os
    print(f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
