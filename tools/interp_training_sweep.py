"""Run the training-versus-construction sweep of chapter 21 (models of the constructed size, wider transformers and the
ResNet of the parameter comparison, trained from random initialisation with equal budgets) and write
`results/interp_training/sweep.json` with provenance.

    python tools/interp_training_sweep.py              # two worker processes, one thread each
    python tools/interp_training_sweep.py --processes 1
"""
import argparse
from pathlib import Path

import torch

from spline_transformers.interpolation_theory import interp_training_medians, interp_training_sweep, save_tikhonov

OUT = Path(__file__).resolve().parents[1] / "results" / "interp_training" / "sweep.json"

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=2, help="worker processes (each on one thread)")
    args = ap.parse_args()
    if args.processes < 1: ap.error(f"--processes must be >= 1, got {args.processes}")
    torch.set_num_threads(1)
    res = interp_training_sweep(command=f"python tools/interp_training_sweep.py --processes {args.processes}", processes=args.processes,
                                log=lambda s: print(s, flush=True))
    save_tikhonov(res, OUT)
    for m in interp_training_medians(res): print(m)
    print("wrote", OUT, "in", res["provenance"]["wall_s"], "s")
