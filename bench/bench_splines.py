"""Spline activation speed: each backend as a ratio to erf-GeLU on the same (64, 256, 512) float32 tensor.

Forward, and forward + backward (input and value gradients), for K = 16, 32, 64 knots on [-8, 8], for three input
distributions: "spread" (3 N(0, 1), today's default), "normal" (N(0, 1), like a layer-normed pre-activation) and
"lm" (a concentrated, skewed histogram like the language-model probes: a two-sided exponential with scales 0.895
left and 0.562 right, so 98% of it lies within [-3.5, 2.2] and half within [-0.62, 0.39]). Rounds interleaved in one
process (every timing in a round runs back to back), medians (or minima) over rounds, 2 threads unless told.
Not a test: it prints one table per distribution with the CPU model and its SIMD flags, the load average before
and after, and the targets.

    python bench/bench_splines.py [--rounds 15] [--threads 2] [--stat median|min] [--clock wall|cpu] [--shape 64 256 512]
                                  [--dists spread normal lm]
"""
import argparse, os, statistics, sys

import timing
timing.user_process()

import torch
import torch.nn.functional as F
from spline_transformers.splines import LinearSpline, set_spline_backend, spline_backend
from timing import CLOCK


def lm_like(shape, g):
    "A concentrated, skewed sample like the language-model probes' pre-activations: 98% within [-3.5, 2.2]."
    u = -torch.rand(*shape, generator=g).log()                        # Exp(1)
    return torch.where(torch.rand(*shape, generator=g) < 0.5, -0.895 * u, 0.562 * u)   # P(x < -3.5) = P(x > 2.2) = 1%

DISTS = {"spread": lambda shape, g: torch.randn(*shape, generator=g) * 3,
         "normal": lambda shape, g: torch.randn(*shape, generator=g),
         "lm": lm_like}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    timing.add_timing_args(ap, rounds=15)
    ap.add_argument("--shape", type=int, nargs="+", default=[64, 256, 512])
    ap.add_argument("--knots", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--backends", nargs="+", default=["cpp", "torch"])
    ap.add_argument("--dists", nargs="+", choices=list(DISTS), default=list(DISTS))
    args = ap.parse_args()
    timing.start(args)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"shape {tuple(args.shape)} float32, baseline erf-GeLU (approximate='none')")
    backends = []
    for b in args.backends:
        set_spline_backend(b)
        choice = spline_backend("cpu")
        print(f"  backend {b!r}: {choice.name} — {choice.reason}")
        if choice.name == b: backends.append(b)
    set_spline_backend("auto")

    g = torch.Generator().manual_seed(0)
    xs = {d: DISTS[d](args.shape, g) for d in args.dists}
    gy = torch.randn(*args.shape, generator=g)
    xgs = {d: x.clone().requires_grad_() for d, x in xs.items()}
    splines = {K: LinearSpline(K, -8.0, 8.0, init="gelu") for K in args.knots}

    def gelu_f(d):
        x = xs[d]
        def f(): F.gelu(x)
        return f
    def gelu_fb(d):
        xg = xgs[d]
        def f():
            xg.grad = None; F.gelu(xg).backward(gy)
        return f
    def spline_f(d, b, K):
        x = xs[d]
        def f():
            set_spline_backend(b)
            with torch.no_grad(): splines[K](x)
        return f
    def spline_fb(d, b, K):
        xg = xgs[d]
        def f():
            set_spline_backend(b)
            xg.grad = None; splines[K].values.grad = None
            splines[K](xg).backward(gy)
        return f

    jobs = {}
    for d in args.dists:
        jobs[(d, "gelu", "-", "f")], jobs[(d, "gelu", "-", "fb")] = gelu_f(d), gelu_fb(d)
        for b in backends:
            for K in args.knots:
                jobs[(d, b, K, "f")], jobs[(d, b, K, "fb")] = spline_f(d, b, K), spline_fb(d, b, K)
    times = {k: [] for k in jobs}
    for f in jobs.values(): f()                     # warm up (builds, allocator)
    for r in range(args.rounds):
        for k, f in jobs.items():
            t = CLOCK[0](); f(); times[k].append(CLOCK[0]() - t)
    set_spline_backend("auto")
    stat = statistics.median if args.stat == "median" else min
    med = {k: stat(v) for k, v in times.items()}
    for d in args.dists:
        x = xs[d]
        inside = ((x > -3.5) & (x < 2.2)).float().mean().item()
        gf, gfb = med[(d, "gelu", "-", "f")], med[(d, "gelu", "-", "fb")]
        print(f"\ninputs {d!r}: {inside:.1%} within [-3.5, 2.2]; {timing.cpu_line()}; {torch.get_num_threads()} threads")
        print(f"erf-GeLU: forward {gf*1e3:.2f} ms, forward+backward {gfb*1e3:.2f} ms ({args.stat} of {args.rounds} interleaved rounds)")
        print(f"{'backend':<8} {'K':>4} {'fwd ms':>8} {'fwd / GeLU':>11} {'f+b ms':>8} {'f+b / GeLU':>11}")
        for b in backends:
            for K in args.knots:
                f, fb = med[(d, b, K, "f")], med[(d, b, K, "fb")]
                print(f"{b:<8} {K:>4} {f*1e3:>8.2f} {f/gf:>10.2f}x {fb*1e3:>8.2f} {fb/gfb:>10.2f}x")
    print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end")
    print("targets: fused cpp <= 1.0x forward, <= 1.2x forward+backward; torch fallback <= 10x forward, <= 8x forward+backward")


if __name__ == "__main__":
    main()
