"""Phase II arms at the book's `cpu` sizes: one model per process (as `reproduce --no-batch-seeds` runs each seed) against
the arm's seeds as one batched ensemble (as `reproduce` runs them), in the same process and rounds, one thread each.

For each arm the whole training step is timed as the trainer pays it (batch generation, forward, backward, optimiser, and
an evaluation's time divided by `eval_every`), for M = 1 and for M = the arm's seed count (10 for ADD). It prints model-steps
per second of each, their ratio, and the MFU: the step's model FLOPs (forward + backward, `torch.utils.flop_counter`) per
second over a big matmul's rate measured in the same rounds. One thread per process is how `reproduce` runs cells, so these
per-core numbers are what `--jobs N` multiplies. Prints the CPU model, its SIMD flags and the load; not a test.

    python bench/bench_batched_seeds.py [--rounds 8] [--seeds 10] [--only add]
"""
import argparse, os

import timing
timing.user_process()

import torch

from bench_step import Case, matmul_rate, PARTS
from spline_transformers.core import cpu_model
from spline_transformers.experiments import EXPERIMENTS
from spline_transformers.runner import load_data
from spline_transformers.two_phase import arch_for, spline_arch, standard_arch


def simd_flags():
    try: flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration): return "unknown"
    return " ".join(f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile") if f in flags)


def arms(only, seeds):
    "(label, lambda M: Case) for the standard and learned arms of the chosen experiments at their cpu size."
    out = []
    for name in (["add", "lm_shakespeare_char"] if only is None else [only]):
        e = EXPERIMENTS[name]; s = e.setting("cpu"); data = load_data(e.task, dict(s.task_params))
        arch = arch_for(data, s.arch); tr = s.train; n = seeds or len(s.seeds)
        for arm, a in (("standard", standard_arch(arch)), ("learned MLP spline", spline_arch(arch, attn=False))):
            out.append((f"{name} {arm}", n, lambda M, a=a, data=data, tr=tr: Case("arm", data, a, M, tr.batch_size, tr.eval_every, tr.eval_examples)))
    return out


def main():
    ap = argparse.ArgumentParser()
    timing.add_timing_args(ap, rounds=8)
    ap.set_defaults(threads=1, clock="cpu")
    ap.add_argument("--seeds", type=int, default=None, help="models in the batched ensemble (default: the arm's seed count)")
    ap.add_argument("--only", choices=sorted(EXPERIMENTS), default=None)
    ap.add_argument("--eval-every-round", type=int, default=3)
    a = ap.parse_args()
    timing.start(a)
    print(f"CPU: {cpu_model()}; SIMD: {simd_flags()}; torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    cases = []
    for label, n, make in arms(a.only, a.seeds):
        for M in (1, n): cases.append((label, M, make(M)))
    for _, _, c in cases:
        for _ in range(2): c.step()
    flops = [c.flops() for _, _, c in cases]
    times, rates = [[] for _ in cases], []
    for r in range(a.rounds):
        rates.append(matmul_rate())
        for i, (_, _, c) in enumerate(cases):
            times[i].append(sum(c.timed_round(r % a.eval_every_round == 0).values()))
    med = lambda v: sorted(v)[len(v) // 2]
    rate = med(rates)
    print(f"big matmul (1024^2 float32): {rate / 1e9:.1f} GFLOP/s (the MFU denominator)\n")
    hdr = f"{'arm':<40} {'M':>3} {'ms/step':>8} {'model-steps/s':>14} {'MFU':>5} {'batched / lone':>15}"
    print(hdr); print("-" * len(hdr))
    lone = {}
    for (label, M, _), f, t in zip(cases, flops, times):
        step = med(t); sps = M / step
        if M == 1: lone[label] = sps
        ratio = "" if M == 1 else f"{sps / lone[label]:14.2f}x"
        print(f"{label:<40} {M:>3} {1e3 * step:8.1f} {sps:14.1f} {100 * f / step / rate:4.0f}% {ratio:>15}")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
