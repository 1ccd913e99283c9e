"""Batch generation speed of the algorithmic tasks (`spline_transformers.tasks`), against two baselines measured in
the same run: a naive per-example Python generator of ADD problems (strings, then a padded tensor), and one
training step (forward, backward, AdamW) of a 2-layer d_model=64 transformer on the same batch. Prints the
median ms per batch of 256 for each task's `weights` and held-out splits, and the ratios. Not a test: timings on
shared machines move by ±20-30% (use --clock cpu with --threads 1 on a busy machine).

    python bench/bench_tasks.py [--threads 1] [--rounds 30] [--batch 256] [--clock wall|cpu]
"""
import argparse, os, random, time

import torch

from spline_transformers.tasks import TASKS, get_task

CLOCK = [time.perf_counter]


def median_ms(fn, rounds):
    fn(); fn()
    ts = []
    for _ in range(rounds):
        t0 = CLOCK[0](); fn(); ts.append(CLOCK[0]() - t0)
    return sorted(ts)[len(ts) // 2] * 1e3


def naive_add_batch(task, B, rnd):
    "The obvious per-example generator: Python ints and strings, then encode and pad."
    rows = []
    for _ in range(B):
        na, nb = rnd.randint(1, task.n_digits), rnd.randint(1, task.n_digits)
        a = rnd.randint(0 if na == 1 else 10 ** (na - 1), 10 ** na - 1)
        b = rnd.randint(0 if nb == 1 else 10 ** (nb - 1), 10 ** nb - 1)
        rows.append(task.encode(f"<bos>{a}+{b}={str(a + b)[::-1]}<eos>"))
    W = max(map(len, rows))
    t = torch.zeros(B, W, dtype=torch.long)
    for i, r in enumerate(rows): t[i, :len(r)] = torch.tensor(r)
    return t


def train_step_fn(task, B):
    try:
        from spline_transformers.model import Transformer, TransformerConfig
    except Exception as e:  # the model chapter may not exist yet
        print(f"(no training-step baseline: {e})"); return None
    m = Transformer(TransformerConfig(vocab_size=task.vocab_size, n_layers=2, d_model=64, n_heads=4, max_len=task.max_len))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    b = task.batch("weights", B, torch.Generator().manual_seed(0))

    def step():
        opt.zero_grad(set_to_none=True)
        logits = m(b.x)
        torch.nn.functional.cross_entropy(logits[b.mask], b.y[b.mask]).backward()
        opt.step()
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    CLOCK[0] = time.process_time if a.clock == "cpu" else time.perf_counter
    print(f"clock: {a.clock} time; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; batch {a.batch}; {a.threads} thread(s)")
    add = get_task("add")
    rnd = random.Random(0)
    naive = median_ms(lambda: naive_add_batch(add, a.batch, rnd), a.rounds)
    step = train_step_fn(add, a.batch)
    step_ms = median_ms(step, a.rounds) if step else float("nan")
    print(f"baselines: naive per-example ADD generator {naive:.2f} ms; one training step (2 layers, d=64) on ADD {step_ms:.2f} ms")
    g = torch.Generator().manual_seed(0)
    for name in TASKS:
        t = get_task(name)
        held = "ood" if "ood" in t.splits else "test"
        w = median_ms(lambda: t.batch("weights", a.batch, g), a.rounds)
        h = median_ms(lambda: t.batch(held, a.batch, g), max(a.rounds // 3, 5))
        print(f"{name:<12} weights {w:6.2f} ms ({naive / w:5.1f}x faster than naive ADD, {w / step_ms:5.2f} of a step)   "
              f"{held:<5} {h:6.2f} ms")
    print("target (issue #5): < ~5 ms per batch of 256")


if __name__ == "__main__":
    main()
