"Issue 17 mechanics: the CPU thread policy of training runs, and the demo's Phase II arms in two processes."
import os
from dataclasses import replace

import pytest
import torch

from spline_transformers.model import TransformerConfig, Transformer
from spline_transformers.tasks import get_task
from spline_transformers.train import (TrainConfig, train, training_threads, thread_policy, make_optimizer, THREADS_ENV,
                                       SMALL_MODEL_WIDTH)
from spline_transformers.two_phase import demo_config, run_demo


def tiny(width=32):
    return Transformer(TransformerConfig(vocab_size=12, n_layers=1, d_model=width, n_heads=2, max_len=16))


def test_small_models_train_on_one_thread(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False); monkeypatch.delenv(THREADS_ENV, raising=False)
    cpu = torch.device("cpu")
    assert training_threads(tiny(), cpu) == 1
    assert training_threads(tiny(2 * SMALL_MODEL_WIDTH), cpu) is None        # bigger models: PyTorch's setting
    assert training_threads(tiny(), torch.device("meta")) is None              # not a CPU run
    monkeypatch.setenv("OMP_NUM_THREADS", "2"); assert training_threads(tiny(), cpu) is None   # the user chose
    monkeypatch.setenv(THREADS_ENV, "3"); assert training_threads(tiny(), cpu) == 3
    monkeypatch.setenv(THREADS_ENV, "torch"); assert training_threads(tiny(), cpu) is None
    monkeypatch.setenv(THREADS_ENV, "two")
    with pytest.raises(ValueError, match=THREADS_ENV): training_threads(tiny(), cpu)


def test_train_runs_small_models_on_one_thread_and_restores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False); monkeypatch.delenv(THREADS_ENV, raising=False)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        task = get_task("add", seed=0, n_digits=2)
        m = Transformer(TransformerConfig(vocab_size=task.vocab_size, n_layers=1, d_model=32, n_heads=2, max_len=task.max_len))
        train(m, task, TrainConfig(steps=4, batch_size=8, eval_every=2, eval_examples=16, warmup=1, progress=False, device="cpu"),
              callbacks=[lambda df: seen.append(torch.get_num_threads())])
        assert seen and set(seen) == {1}, seen
        assert torch.get_num_threads() == 2        # the caller's setting is back
    finally: torch.set_num_threads(old)


def test_optimizer_is_fused_on_cpu():
    m = tiny()
    opt = make_optimizer(m, TrainConfig())
    assert all(g.get("fused") for g in opt.param_groups)


def _quick():
    c = demo_config("cpu")
    return replace(c, arch=replace(c.arch, n_layers=1, d_model=16, n_heads=2, n_knots=16),
                   train=replace(c.train, steps=12, batch_size=16, warmup=2, eval_every=6, eval_examples=32),
                   phase1_train=replace(c.phase1_train, steps=6, batch_size=16, warmup=2, eval_every=3, eval_examples=32),
                   p1=replace(c.p1, n_models=2, seeds=(100, 101)), seeds=(0, 1))


@pytest.mark.slow
def test_demo_runs_its_arms_in_two_processes_with_the_same_results():
    c = _quick()
    par = run_demo(c, parallel=True)
    seq = run_demo(c, parallel=False)
    assert par.timings["phase2_processes"] == 2 and seq.timings["phase2_processes"] == 1
    cols = ["step", "model", "seed", "split", "metric"]
    a, b = (r.metrics.sort_values(cols).reset_index(drop=True) for r in (par, seq))
    assert a[cols].equals(b[cols])
    assert (a.value - b.value).abs().max() < 1e-6
    assert par.summary.equals(seq.summary)


def test_demo_parallel_refuses_callbacks():
    with pytest.raises(ValueError, match="parallel=False"): run_demo(_quick(), parallel=True, callbacks=[print])
