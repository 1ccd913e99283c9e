"""Where a training step's time goes, and how much of the machine it uses (MFU).

For the demo's Phase I step (M = 4 models with trainable splines: a weights pass and a held-out pass), its Phase II
steps (5 models, frozen learned splines; and the standard GeLU/softmax arm), and Part II-like sizes (width 128,
spline MLP and spline attention, 5-digit addition: Phase I with M = 8, and one transfer-matrix cell of one model),
each step is split into batch generation, forward (with the loss), backward, optimiser (clipping and AdamW) and
evaluation (one evaluation's time divided by `eval_every`, as the trainer pays it). The step's model FLOPs (forward +
backward, counted by `torch.utils.flop_counter`) per second of the whole step, divided by a big matmul's rate
measured in the same rounds, is the MFU. The trainer's own pieces are used (`stack_batches`, `forward_models`,
`masked_cross_entropy`, `clip_grad_norm_per_model_`, `make_optimizer`, `evaluate_rows`), so this is what `train` and
`phase1` pay. Prints the machine's load; not a test.

    python bench/bench_step.py [--threads 1] [--rounds 10] [--clock cpu] [--only demo] [--compile]
"""
import argparse, os, time

import timing
timing.user_process()

import torch
from torch.utils.flop_counter import FlopCounterMode

from timing import CLOCK
from spline_transformers.model import TransformerConfig
from spline_transformers.ensemble import Ensemble
from spline_transformers.tasks import get_task
from spline_transformers.two_phase import demo_config, arch_for, spline_arch, standard_arch
from spline_transformers.train import (TrainConfig, data_generator, derive_seed, stack_batches, forward_models, masked_cross_entropy,
                                       clip_grad_norm_per_model_, evaluate_rows, default_eval_splits)
try: from spline_transformers.train import make_optimizer
except ImportError:   # the code before issue 17 (for before/after numbers): plain AdamW over the trainer's groups
    from spline_transformers.train import _param_groups
    def make_optimizer(model, cfg, groups=None):
        return torch.optim.AdamW(_param_groups(model, cfg) if groups is None else groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)

PARTS = ("batch", "forward", "backward", "optimiser", "evaluation")


class Case:
    "One kind of training step, split into the parts the trainer runs."
    def __init__(self, name, task, arch, M, batch, eval_every, eval_examples, phase1=False, compile_=False):
        self.name, self.task, self.phase1, self.eval_every, self.eval_examples = name, task, phase1, eval_every, eval_examples
        self.M, self.batch = M, batch
        self.ens = Ensemble(arch, seeds=list(range(100, 100 + M)) if phase1 else list(range(M))).train()
        nl = self.ens.nonlinearities
        (nl.unfreeze() if phase1 else nl.freeze())
        cfg = TrainConfig(lr=1e-3, batch_size=batch)
        self.opt = make_optimizer(self.ens, cfg, self.ens.param_groups(0.1))
        self.opt_s = torch.optim.Adam(list(nl.parameters()), lr=0.01) if phase1 else None
        self.weights = self.ens.weight_parameters()
        self.gens = [data_generator(0, s, "weights" if phase1 else "data") for s in self.ens.seeds]
        self.arch_gen = torch.Generator().manual_seed(derive_seed("arch", 0))
        self.splits = default_eval_splits(task) + (("arch",) if phase1 else ())
        self.fwd = self.ens
        self.compile_s = None
        if compile_:
            self.fwd = torch.compile(self.ens)
            t0 = time.perf_counter(); self.step(); self.step(); self.compile_s = time.perf_counter() - t0

    def data(self):
        b = stack_batches(self.task, "weights" if self.phase1 else "train", self.batch, self.gens)
        return (b, self.task.batch("arch", self.batch, self.arch_gen)) if self.phase1 else (b, None)

    def forward(self, b, a):
        x, y, mask = b
        if not self.phase1: return [masked_cross_entropy(forward_models(self.fwd, x), y, mask).sum()]
        lw = masked_cross_entropy(self.fwd(x, detach="nonlinearities"), y, mask).sum()
        la = masked_cross_entropy(self.fwd(a.x, detach="weights"), a.y, a.mask).sum()
        return [lw, la]

    def backward(self, losses):
        self.opt.zero_grad(set_to_none=True)
        if self.opt_s: self.opt_s.zero_grad(set_to_none=True)
        for l in losses: l.backward()

    def optimise(self):
        clip_grad_norm_per_model_(self.weights, 1.0, self.M)
        self.opt.step()
        if self.opt_s: self.opt_s.step()

    def evaluate(self):
        evaluate_rows(self.ens, self.task, self.splits, 0, "bench", self.ens.seeds, self.eval_examples, 256)

    def step(self):
        b, a = self.data(); self.backward(self.forward(b, a)); self.optimise()

    def flops(self):
        b, a = self.data()
        with FlopCounterMode(display=False) as fc: self.backward(self.forward(b, a))
        self.opt.zero_grad(set_to_none=True)
        return fc.get_total_flops()

    def timed_round(self, with_eval):
        t = {}
        c = CLOCK[0]
        t0 = c(); b, a = self.data(); t1 = c(); losses = self.forward(b, a); t2 = c(); self.backward(losses); t3 = c(); self.optimise(); t4 = c()
        t.update(batch=t1 - t0, forward=t2 - t1, backward=t3 - t2, optimiser=t4 - t3)
        if with_eval:
            t5 = c(); self.evaluate(); t["evaluation"] = (c() - t5) / self.eval_every
        return t


def matmul_rate(n=1024, reps=3):
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t0 = CLOCK[0]()
    for _ in range(reps): a @ b
    return 2 * n ** 3 * reps / (CLOCK[0]() - t0)


def cases(only, compile_):
    d = demo_config("cpu")
    demo_task = get_task(d.task, seed=0, **d.task_params)
    arch = arch_for(demo_task, d.arch)
    tr = d.train
    out = {}
    if only in (None, "demo"):
        out["demo Phase I (M=4, splines learn)"] = lambda: Case("p1", demo_task, arch, d.p1.n_models, d.phase1_train.batch_size,
                                                                 d.phase1_train.eval_every, d.phase1_train.eval_examples, phase1=True, compile_=compile_)
        out["demo Phase II learned (M=5)"] = lambda: Case("p2", demo_task, spline_arch(arch, attn=False), len(d.seeds), tr.batch_size,
                                                          tr.eval_every, tr.eval_examples, compile_=compile_)
        out["demo Phase II standard (M=5)"] = lambda: Case("std", demo_task, standard_arch(arch), len(d.seeds), tr.batch_size,
                                                           tr.eval_every, tr.eval_examples, compile_=compile_)
    if only in (None, "part2"):
        t5 = get_task("add", seed=0, n_digits=5, ood_digits=(6, 8), reverse_operands=False)
        a2 = arch_for(t5, TransformerConfig(vocab_size=1, max_len=8, n_layers=2, d_model=128, n_heads=4, mlp_act="spline",
                                            attn_fn="spline", n_knots=122, spline_range=20.0))
        out["Part II Phase I (M=8, d=128)"] = lambda: Case("p2p1", t5, a2, 8, 64, 100, 256, phase1=True, compile_=compile_)
        out["Part II cell (M=1, d=128)"] = lambda: Case("cell", t5, a2, 1, 64, 100, 256, compile_=compile_)
    return out


def main():
    ap = argparse.ArgumentParser()
    timing.add_timing_args(ap, rounds=10)
    ap.set_defaults(threads=1, clock="cpu")   # 1 thread, process CPU time: steady on a busy machine
    ap.add_argument("--only", choices=["demo", "part2"], default=None)
    ap.add_argument("--eval-every-round", type=int, default=3, help="time an evaluation every this many rounds (they are slow)")
    ap.add_argument("--compile", action="store_true", help="torch.compile each ensemble's forward: compile time, step time, payback")
    a = ap.parse_args()
    timing.start(a)
    import spline_transformers; print(f"spline_transformers from {spline_transformers.__file__}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    built = {k: f() for k, f in cases(a.only, False).items()}
    comp = {k: f() for k, f in cases(a.only, True).items()} if a.compile else {}
    for c in list(built.values()) + list(comp.values()):
        for _ in range(2): c.step()
    flops = {k: c.flops() for k, c in built.items()}
    times = {k: {p: [] for p in PARTS} for k in list(built) + [k + " [compiled]" for k in comp]}
    rates = []
    for r in range(a.rounds):
        rates.append(matmul_rate())
        for k, c in list(built.items()) + [(k + " [compiled]", c) for k, c in comp.items()]:
            t = c.timed_round(r % a.eval_every_round == 0)
            for p, v in t.items(): times[k][p].append(v)
    stat = (lambda v: min(v)) if a.stat == "min" else (lambda v: sorted(v)[len(v) // 2])
    rate = stat(rates)
    print(f"big matmul (1024^2 float32) on this clock: {rate / 1e9:.1f} GFLOP/s (the MFU denominator)\n")
    hdr = f"{'step':<38} {'GFLOP':>6} {'ms/step':>8} {'MFU':>5} {'MFU fwd+bwd':>11}   " + "  ".join(f"{p:>10}" for p in PARTS)
    print(hdr); print("-" * len(hdr))
    for k in times:
        base = k.replace(" [compiled]", "")
        med = {p: stat(v) for p, v in times[k].items()}
        total = sum(med.values())
        f = flops[base]
        mfu, mfu_fb = f / total / rate, f / (med["forward"] + med["backward"]) / rate
        parts = "  ".join(f"{100 * med[p] / total:9.0f}%" for p in PARTS)
        print(f"{k:<38} {f / 1e9:6.2f} {total * 1e3:8.1f} {100 * mfu:4.0f}% {100 * mfu_fb:10.0f}%   {parts}")
        if k.endswith("[compiled]"):
            eager = sum(stat(v) for v in times[base].values())
            gain = eager - total
            c = comp[base]
            pay = f"pays back after {c.compile_s / gain:.0f} steps" if gain > 0 else "never pays back (no faster)"
            print(f"{'':<38} compile {c.compile_s:.1f} s, {1e3 * gain:+.1f} ms/step vs eager: {pay}")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
