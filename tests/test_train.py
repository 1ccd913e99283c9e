"""The trainer's guarantees: exact resumption from any checkpoint (also after a simulated kill), clear errors for corrupt
or mismatched checkpoints, divergence handling, device errors, and CPU reproducibility."""
import json, math, shutil
from dataclasses import replace

import pandas as pd
import pytest
import torch

from spline_transformers.model import Transformer, TransformerConfig
from spline_transformers.tasks import get_task
from spline_transformers.train import (CheckpointError, TrainConfig, TrainingDiverged, list_checkpoints, load_state,
                                       resolve_device, train)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def task():
    return get_task("add", seed=0, n_digits=2, ood_digits=(3, 3))


def make_model(task, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=task.vocab_size, n_layers=1, d_model=32, n_heads=2, max_len=task.max_len, **kw)
    return Transformer(cfg)


def cfg_for(tmp, **kw):
    base = dict(steps=12, batch_size=16, lr=3e-3, warmup=2, eval_every=4, eval_examples=64, device="cpu",
                progress=False, checkpoint_dir=str(tmp) if tmp is not None else None, seed=3)
    return TrainConfig(**{**base, **kw})


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa: assert torch.equal(sa[k], sb[k]), f"{k} differs"


class Kill(Exception): pass


def kill_at(step):
    def cb(rows):
        if int(rows.step.iloc[0]) == step: raise Kill(step)
    return cb


@pytest.fixture(scope="module")
def reference(task, tmp_path_factory):
    "An uninterrupted run with checkpoints every 4 steps."
    d = tmp_path_factory.mktemp("ref")
    return train(make_model(task), task, cfg_for(d, checkpoint_every=4)), d


def test_reproducible(task, reference):
    ref, _ = reference
    again = train(make_model(task), task, cfg_for(None))
    same_weights(ref.model, again.model)
    pd.testing.assert_frame_equal(ref.metrics, again.metrics)
    assert set(ref.metrics.split) == {"test", "ood", "train"}
    assert ref.metrics.step.max() == 12


@pytest.mark.parametrize("start", [4, 8])
def test_resume_from_middle_checkpoint_is_exact(task, reference, tmp_path, start):
    ref, ref_dir = reference
    names = [p.name for p in list_checkpoints(ref_dir)]
    assert names == [f"step-{s:08d}.safetensors" for s in (0, 4, 8, 12)]
    shutil.copy(ref_dir / f"step-{start:08d}.safetensors", tmp_path)
    res = train(make_model(task, seed=99), task, cfg_for(tmp_path, checkpoint_every=4),   # different init: weights come from the file
                resume=tmp_path / f"step-{start:08d}.safetensors")
    assert (res.steps, res.steps_run) == (12, 12 - start)
    same_weights(ref.model, res.model)
    pd.testing.assert_frame_equal(ref.metrics, res.metrics)


def test_killed_run_resumes_exactly(task, reference, tmp_path):
    ref, _ = reference
    cfg = cfg_for(tmp_path, checkpoint_every=4)
    with pytest.raises(Kill):
        train(make_model(task), task, cfg, callbacks=[kill_at(8)])
    assert [p.name for p in list_checkpoints(tmp_path)][-1] == "step-00000008.safetensors"
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
    seen = []
    res = train(make_model(task, seed=5), task, cfg, resume="latest", callbacks=[seen.append])
    same_weights(ref.model, res.model)
    pd.testing.assert_frame_equal(ref.metrics, res.metrics)
    assert [int(r.step.iloc[0]) for r in seen] == [12]   # callbacks see only the new evaluations


def test_resume_latest_without_checkpoint_starts_fresh(task, reference, tmp_path):
    ref, _ = reference
    res = train(make_model(task), task, cfg_for(tmp_path / "empty"), resume="latest")
    same_weights(ref.model, res.model)


def test_corrupt_checkpoints_are_clear_errors(task, reference, tmp_path):
    _, ref_dir = reference
    src = ref_dir / "step-00000004.safetensors"
    data = src.read_bytes()
    bad = tmp_path / "truncated.safetensors"; bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated|corrupt"): load_state(bad)
    with pytest.raises(CheckpointError, match="truncated|corrupt"):
        train(make_model(task), task, cfg_for(tmp_path), resume=bad)
    flipped = bytearray(data); flipped[len(data) - 100] ^= 0x5A
    bad2 = tmp_path / "flipped.safetensors"; bad2.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="checksum"): load_state(bad2)
    header = bytearray(data); header[20] ^= 0x5A
    bad3 = tmp_path / "header.safetensors"; bad3.write_bytes(bytes(header))
    with pytest.raises(CheckpointError): load_state(bad3)
    with pytest.raises(CheckpointError, match="no checkpoint"): load_state(tmp_path / "missing.safetensors")
    other = tmp_path / "not_ours.safetensors"
    from safetensors.torch import save_file
    save_file({"a": torch.zeros(2)}, str(other))
    with pytest.raises(CheckpointError, match="not a spline_transformers checkpoint"): load_state(other)


def test_mismatched_checkpoints_are_clear_errors(task, reference):
    _, ref_dir = reference
    ck = ref_dir / "step-00000004.safetensors"
    with pytest.raises(CheckpointError, match="model.d_model"):
        torch.manual_seed(0)
        big = Transformer(TransformerConfig(vocab_size=task.vocab_size, n_layers=1, d_model=64, n_heads=2, max_len=task.max_len))
        train(big, task, cfg_for(None), resume=ck)
    with pytest.raises(CheckpointError, match="train.warmup"):
        train(make_model(task), task, cfg_for(None, warmup=5), resume=ck)
    with pytest.raises(CheckpointError, match="train.seed"):
        train(make_model(task), task, cfg_for(None, seed=4), resume=ck)
    # run-only settings may change on resumption
    res = train(make_model(task), task, cfg_for(None, progress=False, checkpoint_every=2), resume=ck)
    assert res.steps_run == 8


class NaNAfter(Transformer):
    "A model whose training forward returns NaN logits from the `n`-th call on."
    def __init__(self, cfg, n):
        super().__init__(cfg); self.calls, self.n = 0, n
    def forward(self, tokens, *a, **kw):
        out = super().forward(tokens, *a, **kw)
        if self.training:
            self.calls += 1
            if self.calls >= self.n: out = out * float("nan")
        return out


def test_divergence_stops_and_keeps_last_good_checkpoint(task, tmp_path):
    torch.manual_seed(0)
    m = NaNAfter(make_model(task).cfg, n=7)     # steps 0..5 are fine, step 6 diverges
    with pytest.raises(TrainingDiverged, match="diverged at step 6") as e:
        train(m, task, cfg_for(tmp_path, checkpoint_every=4))
    assert e.value.step == 6
    assert e.value.checkpoint.name == "step-00000004.safetensors"
    assert [p.name for p in list_checkpoints(tmp_path)][-1] == "step-00000004.safetensors"
    load_state(e.value.checkpoint)   # still valid


def test_device_errors():
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="use device='cpu'"): resolve_device("cuda")
        with pytest.raises(RuntimeError, match="use device='cpu'"): resolve_device("cuda:1")
    with pytest.raises(ValueError, match="not a device name"): resolve_device("gpu0")


def test_unknown_options_are_listed():
    with pytest.raises(ValueError, match="unknown schedule 'step'; valid values are 'cosine', 'trapezoid', 'constant'"): TrainConfig(schedule="step")


def test_ensemble_training_equals_separate_runs(task):
    "An Ensemble of seeds [0, 1] trains like two single models (per-model clipping, per-model data streams)."
    from spline_transformers.ensemble import Ensemble
    cfg = cfg_for(None, steps=6, eval_every=3, grad_clip=0.05)
    ens = train(Ensemble(make_model(task).cfg, seeds=[0, 1]), task, cfg)
    for i, s in enumerate([0, 1]):
        single = train(make_model(task, seed=s), task, cfg, seeds=[s])
        for (k, a), b in zip(single.model.state_dict().items(), ens.model.extract(i).state_dict().values()):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=k)
        a = single.metrics.drop(columns="seed").reset_index(drop=True)
        b = ens.metrics[ens.metrics.seed == s].drop(columns="seed").reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b, atol=1e-5, check_exact=False)


# ---------------------------------------------------------------- issue 14: nothing lost, nothing silent
import os, socket, subprocess, sys
from torch.optim.optimizer import register_optimizer_step_post_hook


def _all_finite(state) -> bool:
    "Every tensor in a loaded checkpoint's module and optimiser state is finite."
    def walk(x):
        if isinstance(x, torch.Tensor): return bool(torch.isfinite(x).all()) if x.is_floating_point() else True
        if isinstance(x, dict): return all(walk(v) for v in x.values())
        if isinstance(x, (list, tuple)): return all(walk(v) for v in x)
        return True
    return walk(state["module"]) and walk(state["optimizers"])


def test_update_that_breaks_the_weights_is_never_checkpointed(task, tmp_path):
    "An update making a weight infinite (its loss was finite) must not be saved; the message names a finite checkpoint, and resuming from it with a lower lr works."
    calls = []
    def poison(opt, args, kwargs):
        calls.append(1)
        if len(calls) == 8:   # the update of step 7: the run is at step 8 right after it, a checkpoint step
            with torch.no_grad(): opt.param_groups[0]["params"][0].fill_(math.inf)
    h = register_optimizer_step_post_hook(poison)
    try:
        with pytest.raises(TrainingDiverged) as e:
            train(make_model(task), task, cfg_for(tmp_path, checkpoint_every=4))
    finally: h.remove()
    for p in list_checkpoints(tmp_path): assert _all_finite(load_state(p)["state"]), f"{p.name} holds non-finite state"
    ck = e.value.checkpoint
    assert ck is not None and ck.name == "step-00000004.safetensors", str(e.value)
    assert str(ck) in str(e.value) and "lr" in str(e.value)
    assert _all_finite(load_state(ck)["state"])
    # the advice can be followed: resume from that checkpoint with a lower learning rate; the change is in the metrics
    res = train(make_model(task), task, cfg_for(tmp_path, checkpoint_every=4, lr=1e-3), resume=ck)
    assert (res.steps, res.steps_run) == (12, 8)
    lr_rows = res.metrics[res.metrics.metric == "lr"]
    assert list(lr_rows.step) == [4] and list(lr_rows.value) == [1e-3], lr_rows
    again = train(make_model(task), task, cfg_for(tmp_path, checkpoint_every=4, lr=1e-3), resume="latest")   # the new lr is the run's now
    assert again.steps_run == 0


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"]); p.wait()
    return p.pid


def _hold_lock(folder, ready, stop):
    from spline_transformers.core import FolderLock
    FolderLock(folder, "checkpoint folder").acquire(); ready.set(); stop.wait(60)


def test_checkpoint_folder_is_locked_and_cleaned(task, tmp_path, capsys):
    import multiprocessing
    from spline_transformers.core import FolderLock
    d = tmp_path / "ck"; d.mkdir()
    fork = multiprocessing.get_context("fork")   # the child only takes the lock and waits
    ready, stop = fork.Event(), fork.Event()
    holder = fork.Process(target=_hold_lock, args=(str(d), ready, stop)); holder.start()
    try:
        assert ready.wait(30)                                                            # a live process holds it
        with pytest.raises(RuntimeError, match=rf"checkpoint folder .* is in use by process {holder.pid} on {socket.gethostname()}"):
            train(make_model(task), task, cfg_for(d, steps=4))
        assert not list_checkpoints(d)
    finally: holder.kill(); holder.join(30)                                              # its run is killed: the lock goes with it
    dead = _dead_pid()
    stale = d / f".step-00000004.safetensors.tmp-{dead}-abc123xy"; stale.write_bytes(b"half a checkpoint")
    res = train(make_model(task), task, cfg_for(d, steps=4))
    assert res.steps == 4 and not stale.exists()
    with FolderLock(d) as lock: assert lock.held                                         # given back at the end


def test_resume_says_when_there_is_nothing_to_resume(task, tmp_path, capsys):
    train(make_model(task), task, cfg_for(tmp_path / "empty", steps=2), resume=True)
    err = capsys.readouterr().err
    assert f"no checkpoint in {tmp_path / 'empty'}; starting from step 0" in err
    with pytest.raises(ValueError, match="checkpoint_dir"):
        train(make_model(task), task, cfg_for(None, steps=2), resume=True)


def test_resume_refuses_other_task_parameters(task, tmp_path):
    train(make_model(task), task, cfg_for(tmp_path, steps=4))
    other = get_task("add", seed=0, n_digits=2, ood_digits=(4, 4))
    with pytest.raises(CheckpointError, match="different run"):
        train(make_model(task), other, cfg_for(tmp_path, steps=4), resume=True)


def test_fresh_run_refuses_a_folder_holding_another_runs_checkpoints(task, tmp_path):
    "A second run started fresh in a folder of checkpoints would overwrite some of them and leave the rest: refused."
    train(make_model(task), task, cfg_for(tmp_path, steps=8))
    before = {p.name: p.read_bytes() for p in list_checkpoints(tmp_path)}
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        train(make_model(task), task, cfg_for(tmp_path, steps=4))
    assert {p.name: p.read_bytes() for p in list_checkpoints(tmp_path)} == before


def test_progress_text_shows_the_accuracy_first():
    "The bar's text lists accuracies before losses, so a narrow terminal cuts a loss, never the accuracy."
    from spline_transformers.train import _postfix
    rows = [dict(split=sp, metric=m, value=v, seed=0) for sp in ("test", "ood") for m, v in (("loss", 1.5), ("token_acc", 0.5), ("seq_acc", 0.25))]
    text = _postfix(rows)
    assert text.split()[:2] == ["test/seq_acc=0.25", "ood/seq_acc=0.25"], text


# ---------------------------------------------------------------- issue 29 D2: a good checkpoint is one whose weights still work
def _probe_loss(task, module_state):
    "The loss of a model with `module_state`'s weights on one fixed training batch."
    from spline_transformers.train import data_generator, forward_models, masked_cross_entropy, stack_batches
    m = make_model(task); m.load_state_dict(module_state); m.eval()
    x, y, mask = stack_batches(task, "train", 64, [data_generator(7, 0)])
    with torch.no_grad(): return float(masked_cross_entropy(forward_models(m, x), y, mask)[0])


def test_diverging_run_resumes_with_a_lower_lr_past_the_divergence(task, tmp_path):
    "A huge lr (AdamW's decay factor 1 - lr * wd = -9 a step) blows the weights up until the loss is NaN; the last good checkpoint's weights still give a sane loss, and resuming from it with a lower lr trains past that step."
    cfg = cfg_for(tmp_path, lr=100.0, warmup=0, schedule="constant", steps=24, eval_every=8, checkpoint_every=1)
    with pytest.raises(TrainingDiverged) as e: train(make_model(task), task, cfg)
    diverged, ck = e.value.step, e.value.checkpoint
    assert ck is not None, str(e.value)
    initial = _probe_loss(task, load_state(list_checkpoints(tmp_path)[0])["state"]["module"])
    for p in list_checkpoints(tmp_path):   # every checkpoint left is good: finite, sane loss, weights not blown up
        sd = load_state(p)["state"]
        assert _all_finite(sd), p.name
        loss = _probe_loss(task, sd["module"])
        assert math.isfinite(loss) and loss < 10 * initial, f"{p.name}: its weights give loss {loss}"
        assert max(float(v.abs().max()) for v in sd["module"].values()) < 1e4, f"{p.name}: weights blown up"
    res = train(make_model(task), task, replace(cfg, lr=1e-3), resume=ck)
    assert res.steps == 24 > diverged
    losses = res.metrics[(res.metrics.metric == "loss")].value
    assert losses.map(math.isfinite).all() and float(res.metrics[(res.metrics.split == "train") & (res.metrics.metric == "loss")].value.iloc[-1]) < 10 * initial
    lr_rows = res.metrics[res.metrics.metric == "lr"]
    assert list(lr_rows.value) == [1e-3] and list(lr_rows.step) == [int(load_state(ck)["state"]["step"])]
