"""Run the Tikhonov sweep of chapter 21 (minimum training loss against eps, cold and warm starts, several seeds, equal
budgets) on one CPU thread and write `results/tikhonov/sweep.json` with provenance.

    python tools/tikhonov_sweep.py            # about 13 minutes on one core
"""
import sys
from pathlib import Path

import torch

from spline_transformers.interpolation_theory import save_tikhonov, tikhonov_slope, tikhonov_sweep

OUT = Path(__file__).resolve().parents[1] / "results" / "tikhonov" / "sweep.json"

if __name__ == "__main__":
    torch.set_num_threads(1)
    res = tikhonov_sweep(command="python tools/tikhonov_sweep.py", log=lambda s: print(s, flush=True))
    save_tikhonov(res, OUT)
    for start in res["setting"]["starts"]: print(tikhonov_slope(res, start))
    print("wrote", OUT, "in", res["provenance"]["wall_s"], "s")
