"""Spline activation speed: each backend as a ratio to erf-GeLU on the same (64, 256, 512) float32 tensor.

Forward, and forward + backward (input and value gradients), for K = 16, 32, 64 knots; rounds interleaved in one
process (every timing in a round runs back to back), medians (or minima) over rounds, 2 threads unless told.
Not a test: it prints a table, the load average before and after, and the targets.

    python bench/bench_splines.py [--rounds 15] [--threads 2] [--stat median|min] [--clock wall|cpu] [--shape 64 256 512]
"""
import argparse, os, statistics, sys

import timing
timing.user_process()

import torch
import torch.nn.functional as F
from spline_transformers.splines import LinearSpline, set_spline_backend, spline_backend
from timing import CLOCK


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    timing.add_timing_args(ap, rounds=15)
    ap.add_argument("--shape", type=int, nargs="+", default=[64, 256, 512])
    ap.add_argument("--knots", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--backends", nargs="+", default=["cpp", "torch"])
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
    x = torch.randn(*args.shape, generator=g) * 3
    gy = torch.randn(*args.shape, generator=g)
    xg = x.clone().requires_grad_()
    splines = {K: LinearSpline(K, -8.0, 8.0, init="gelu") for K in args.knots}

    def gelu_f(): F.gelu(x)
    def gelu_fb():
        xg.grad = None; F.gelu(xg).backward(gy)
    def spline_f(b, K):
        def f():
            set_spline_backend(b)
            with torch.no_grad(): splines[K](x)
        return f
    def spline_fb(b, K):
        def f():
            set_spline_backend(b)
            xg.grad = None; splines[K].values.grad = None
            splines[K](xg).backward(gy)
        return f

    jobs = {("gelu", "-", "f"): gelu_f, ("gelu", "-", "fb"): gelu_fb}
    for b in backends:
        for K in args.knots:
            jobs[(b, K, "f")], jobs[(b, K, "fb")] = spline_f(b, K), spline_fb(b, K)
    times = {k: [] for k in jobs}
    for f in jobs.values(): f()                     # warm up (builds, allocator)
    for r in range(args.rounds):
        for k, f in jobs.items():
            t = CLOCK[0](); f(); times[k].append(CLOCK[0]() - t)
    set_spline_backend("auto")
    stat = statistics.median if args.stat == "median" else min
    med = {k: stat(v) for k, v in times.items()}
    gf, gfb = med[("gelu", "-", "f")], med[("gelu", "-", "fb")]
    print(f"\nerf-GeLU: forward {gf*1e3:.2f} ms, forward+backward {gfb*1e3:.2f} ms ({args.stat} of {args.rounds} interleaved rounds)\n")
    print(f"{'backend':<8} {'K':>4} {'fwd ms':>8} {'fwd / GeLU':>11} {'f+b ms':>8} {'f+b / GeLU':>11}")
    for b in backends:
        for K in args.knots:
            f, fb = med[(b, K, "f")], med[(b, K, "fb")]
            print(f"{b:<8} {K:>4} {f*1e3:>8.2f} {f/gf:>10.2f}x {fb*1e3:>8.2f} {fb/gfb:>10.2f}x")
    print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end")
    print("targets: fused cpp <= 1.0x forward, <= 1.2x forward+backward; torch fallback <= 10x forward, <= 8x forward+backward")


if __name__ == "__main__":
    main()
