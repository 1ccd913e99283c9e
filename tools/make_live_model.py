"""Train the small ADD model whose splines a reader edits on the site (chapter 11's `learned` arm, seed 0), and write it
into the package as `spline_transformers/live/add.safetensors` (weights, learned MLP spline, fixed test problems).

    PYTHONPATH=. python tools/make_live_model.py      # about a minute or two on a CPU

The setting is the `cpu` size of the `add` experiment: 2-digit addition, 2 layers, width 64, the MLP spline Phase I
learned (the zoo's `add`, frozen), 800 steps of AdamW. What the file holds is read by `load_live_model` (the editor chapter, 10a)."""
import sys, time
import torch

from spline_transformers.experiments import EXPERIMENTS
from spline_transformers.runner import load_data
from spline_transformers.results import load_learned
from spline_transformers.two_phase import phase2
from spline_transformers.editor import save_live_model, live_dir

if __name__ == "__main__":
    s = EXPERIMENTS["add"].setting("cpu")
    task = load_data("add", dict(s.task_params))
    nl = load_learned("add")
    t0 = time.time()
    res = phase2(task, nl, s.arch, s.train, seeds=[0], name="learned")
    model = res.model.extract(0).eval()
    print(f"trained in {time.time() - t0:.0f} s:", task.evaluate(model, "test", 256))
    path = save_live_model(model, task, live_dir() / "add.safetensors", split="test", n=256,
                           source="chapter 11's `learned` arm: the zoo's `add` MLP spline (frozen), Phase II seed 0, the cpu setting")
    print(path, path.stat().st_size, "bytes")
