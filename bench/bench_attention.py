"""Spline-kernel attention against `F.scaled_dot_product_attention` (SDPA), causal, at the size of the
performance target (B=32, H=4, T=128, d_head=32), forward and forward + backward. Prints ratios measured in
this one run (rounds interleaved, medians). Not a test: timings on shared machines move by ±20-30%.

    python bench/bench_attention.py [--threads 2] [--rounds 30] [--T 128]

It runs in the process a user gets (bench/timing.py: the package's heap and thread settings, nothing more).
"""
import argparse

import timing
timing.user_process()

import torch

from timing import CLOCK
import torch.nn.functional as F

from spline_transformers.attention import attend, alibi_bias
from spline_transformers.splines import LinearSpline, spline_backend


def timeit(fn, rounds):
    "Median seconds of `fn` over interleaved rounds (caller interleaves)."
    t0 = CLOCK[0](); fn(); return CLOCK[0]() - t0


def main():
    ap = argparse.ArgumentParser()
    timing.add_timing_args(ap, rounds=30)
    ap.add_argument("--B", type=int, default=32); ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--T", type=int, default=128); ap.add_argument("--D", type=int, default=32)
    a = ap.parse_args()
    timing.start(a)
    torch.manual_seed(0)
    shape = (a.B, a.H, a.T, a.D)
    q, k, v = (torch.randn(shape) for _ in range(3))
    g = torch.randn(shape)
    spline = LinearSpline(n_knots=64, x_min=-15.0, x_max=15.0, init="exp")
    bias = alibi_bias(a.H, a.T)

    paths = {
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "explicit softmax": lambda q, k, v: torch.softmax(
            (q @ k.transpose(-1, -2) / a.D ** 0.5).masked_fill(~torch.ones(a.T, a.T, dtype=torch.bool).tril(), float("-inf")), -1) @ v,
        "spline kernel": lambda q, k, v: attend(q, k, v, "spline", phi=spline),
        "spline kernel + alibi": lambda q, k, v: attend(q, k, v, "spline", phi=spline, bias=bias),
        "hardmax": lambda q, k, v: attend(q, k, v, "hardmax"),
    }

    def fwd(f):
        def run():
            with torch.no_grad(): f(q, k, v)
        return run

    def fwd_bwd(f):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        def run():
            out = f(qg, kg, vg)
            out.backward(g)
        return run

    results = {}
    for mode, make in (("forward", fwd), ("forward+backward", fwd_bwd)):
        runs = {name: make(f) for name, f in paths.items() if not (mode != "forward" and name == "hardmax")}
        for r in runs.values(): r(); r()  # warm up
        times = {name: [] for name in runs}
        for _ in range(a.rounds):
            for name, r in runs.items(): times[name].append(timeit(r, 1))
        med = {name: (min(t) if a.stat == 'min' else sorted(t)[len(t) // 2]) for name, t in times.items()}
        results[mode] = med

    print(f"attention, causal, B={a.B} H={a.H} T={a.T} d_head={a.D}, float32, {a.threads} threads, "
          f"spline backend: {spline_backend('cpu').name} ({spline_backend('cpu').reason})")
    print(f"{'path':<24}{'forward ms':>12}{'ratio':>8}{'fwd+bwd ms':>14}{'ratio':>8}")
    for name in paths:
        f = results["forward"][name] * 1e3
        fb = results["forward+backward"].get(name)
        rf = results["forward"][name] / results["forward"]["sdpa"]
        fb_s = f"{fb * 1e3:14.2f}{fb / results['forward+backward']['sdpa']:7.2f}x" if fb else f"{'-':>14}{'-':>8}"
        print(f"{name:<24}{f:12.2f}{rf:7.2f}x{fb_s}")
    print("target (PERFORMANCE.md): spline kernel <= 1.5x SDPA, forward and forward+backward")


if __name__ == "__main__":
    main()
