"""A registered experiment small enough to run in seconds, for the tests of the runner (`test_results_safety.py`).

`register_tiny()` adds it to the registry of this process only; `python tests/tiny_experiment.py ARGS` runs the command line
with it registered, so that a test can kill a real `reproduce` process at any moment."""
import os, sys
from dataclasses import replace

import pytest

from spline_transformers.experiments import EXPERIMENTS, Arm, Experiment, Phase1Run, register
from spline_transformers.stats import Verdict
import spline_transformers.registry  # noqa: F401  (the book's experiments, which the tiny one is cut from)

NAME = "tiny"
LONG_ENV = "TINY_SMOKE_STEPS"   # the smoke size's Phase II steps (default 10): a test that kills a run mid-cell makes its cells long

def tiny_experiment()->Experiment:
    "Parentheses at a third of its smoke size: one Phase I run of two models, two arms of two seeds (5 cells, seconds each)."
    base = EXPERIMENTS["parentheses"].setting("smoke")
    def sized(steps:int):
        return replace(base, arch=replace(base.arch, d_model=16, n_heads=2),
                       train=replace(base.train, steps=steps, batch_size=8, warmup=2, eval_every=5, eval_examples=16),
                       phase1_train=replace(base.phase1_train, steps=6, batch_size=8, warmup=1, eval_every=3, eval_examples=16),
                       phase1_runs=(Phase1Run("mlp_r0", seeds=(100, 101)),), arms=(Arm("standard"), Arm("learned", "phase1:mlp_r0")),
                       seeds=(0, 1))
    return Experiment(NAME, "tiny", claim="A test's experiment.", paper="none", task="parentheses",
                      sizes={"smoke": sized(int(os.environ.get(LONG_ENV, 10))), "cpu": sized(15), "gpu": sized(20)}, verdicts=(Verdict("learned"),))

def register_tiny()->Experiment:
    "Register the tiny experiment in this process (idempotent)."
    return EXPERIMENTS[NAME] if NAME in EXPERIMENTS else register(tiny_experiment())

def unregister_tiny(): EXPERIMENTS.pop(NAME, None)

@pytest.fixture(scope="module")
def tiny():
    "The tiny experiment registered in this process for one test module only (the registry's other tests never see it)."
    exp = register_tiny()
    yield exp
    unregister_tiny()

if __name__ == "__main__":
    register_tiny()
    from spline_transformers.cli import main
    sys.exit(main(sys.argv[1:]))
