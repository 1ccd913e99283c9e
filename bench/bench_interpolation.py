"""Time building and verifying exact interpolators (N = 50 sequences of 100 tokens in d = 20).

Run: python bench/bench_interpolation.py   (prints seconds; baseline = one forward pass of all tokens through the
built transformer, measured in the same run, so the ratio is comparable across machines)."""
import time
import numpy as np
import torch
from spline_transformers.interpolation import build_interpolator, expected_blocks

torch.set_num_threads(1)   # one thread: on shared 2-core machines two threads only add contention

def dataset(N=50, n=100, d=20, m_max=5, seed=0):
    rng = np.random.default_rng(seed)
    X = [rng.standard_normal((n, d)) for _ in range(N)]
    Y = [rng.standard_normal((int(rng.integers(1, m_max + 1)), d)) for _ in range(N)]
    return X, Y

def run(m_max, attention, N=50, n=100, d=20):
    X, Y = dataset(N, n, d, m_max)
    t0 = time.perf_counter(); T = build_interpolator(X, Y, attention=attention); t_build = time.perf_counter() - t0
    t0 = time.perf_counter(); outs = T.forward_many(X); t_fwd = time.perf_counter() - t0
    assert T.n_blocks == expected_blocks(Y, attention)
    print(f"{attention:8s} N={N} n={n} d={d} m_j<={m_max:3d}  sum m_j={sum(map(len, Y)):5d}  blocks={T.n_blocks:6d}  "
          f"params={T.n_params:9,d}  build+verify {t_build:6.2f} s  (one forward of all tokens {t_fwd:.3f} s, ratio {t_build / t_fwd:.0f}x)  "
          f"worst Hausdorff {T.info['hausdorff'].max():.1e}")

if __name__ == "__main__":
    import sys
    cases = [(5, "hardmax"), (5, "softmax"), (20, "hardmax")] + ([(100, "hardmax")] if "--all" in sys.argv else [])
    for m_max, att in cases: run(m_max, att)
