"""Phase I's gradient routing (checked against a hand-written step), the grad hook, staggered starts, exact resumption,
saving/loading results, Phase II freezing, and the transfer matrix read off the cells' metrics."""
import shutil
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from spline_transformers.ensemble import Ensemble
from spline_transformers.model import Nonlinearities, TransformerConfig
from spline_transformers.tasks import get_task
from spline_transformers.train import (CheckpointError, TrainConfig, data_generator, derive_seed, list_checkpoints,
                                       masked_cross_entropy, stack_batches)
from spline_transformers.two_phase import (Phase1Config, arch_for, assemble_transfer, baseline, compare, load_phase1,
                                           phase1, phase2, standard_arch)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def task():
    return get_task("add", seed=0, n_digits=2, ood_digits=(3, 3))


ARCH = TransformerConfig(vocab_size=1, max_len=8, n_layers=1, d_model=16, n_heads=2, mlp_act="spline", attn_fn="spline",
                         n_knots=16, spline_range=4.0)


def tcfg(**kw):
    base = dict(steps=4, batch_size=8, lr=3e-3, warmup=0, schedule="constant", eval_every=2, eval_examples=32,
                device="cpu", progress=False, grad_clip=None, seed=5)
    return TrainConfig(**{**base, **kw})


def test_phase1_step_matches_hand_written_routing(task):
    "One Phase I step equals: weights step on their own loss with splines detached, spline step on the arch loss only."
    cfg, p1 = tcfg(steps=1, eval_every=1), Phase1Config(n_models=2, seeds=(3, 4), spline_lr=0.05)
    res = phase1(task, ARCH, cfg, p1)
    arch = arch_for(task, ARCH)
    ens = Ensemble(arch, seeds=[3, 4])
    nl = list(ens.nonlinearities.parameters())
    opt_w = torch.optim.AdamW(ens.param_groups(cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    opt_s = torch.optim.Adam(nl, lr=p1.spline_lr, betas=p1.spline_betas, eps=cfg.eps)
    x, y, m = stack_batches(task, "weights", cfg.batch_size, [data_generator(cfg.seed, s, "weights") for s in (3, 4)])
    lw = masked_cross_entropy(ens(x), y, m).sum()
    gw = torch.autograd.grad(lw, ens.weight_parameters())
    b = task.batch("arch", cfg.batch_size, torch.Generator().manual_seed(derive_seed("arch", cfg.seed)))
    la = masked_cross_entropy(ens(b.x), b.y, b.mask).sum()
    gs = torch.autograd.grad(la, nl)
    for p, g in zip(ens.weight_parameters(), gw): p.grad = g
    for p, g in zip(nl, gs): p.grad = g
    opt_w.step(); opt_s.step()
    got = res.ensemble
    for a, b_ in zip(ens.weight_parameters(), got.weight_parameters()): torch.testing.assert_close(a, b_, rtol=0, atol=1e-6)
    for a, b_ in zip(nl, res.nonlinearities.parameters()): torch.testing.assert_close(a, b_, rtol=0, atol=1e-6)
    assert any((a.detach() - b_).abs().max() > 1e-3 for a, b_ in zip(nl, Nonlinearities.from_config(arch).parameters()))


def test_grad_hook_sees_and_controls_spline_gradients(task):
    calls = []
    def zero(params):
        calls.append(len(params))
        for p in params: p.grad.zero_()
    res = phase1(task, ARCH, tcfg(), Phase1Config(n_models=2), grad_hook=zero)
    assert calls == [2] * 4          # one MLP and one attention spline, every step
    fresh = Nonlinearities.from_config(arch_for(task, ARCH))
    for a, b in zip(res.nonlinearities.parameters(), fresh.parameters()): assert torch.equal(a, b)   # Adam with zero gradient: no move


def test_staggered_models_keep_their_init_until_they_start(task):
    from spline_transformers.two_phase import _staggered_starts
    starts = _staggered_starts(8, 4)
    assert starts[0] == 0 and starts[6] == 3 and starts[7] == 4      # model 7 would start after the last step
    res = phase1(task, ARCH, tcfg(steps=4), Phase1Config(n_models=8, staggered=True, arch_loss="train"))
    init = Ensemble(arch_for(task, ARCH), seeds=list(range(100, 108)))   # the default Phase I seeds
    w, w0 = res.ensemble.weight("blocks.0.mlp.fc.weight"), init.weight("blocks.0.mlp.fc.weight")
    assert not torch.equal(w[0], w0[0]) and not torch.equal(w[6], w0[6])
    assert torch.equal(w[7], w0[7])


def test_phase1_resume_is_exact_and_results_round_trip(task, tmp_path):
    p1 = Phase1Config(n_models=2, spline_lr=0.05)
    full = phase1(task, ARCH, tcfg(steps=6, checkpoint_dir=str(tmp_path / "a")), p1)
    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "a" / "step-00000002.safetensors", tmp_path / "b")
    again = phase1(task, ARCH, tcfg(steps=6, checkpoint_dir=str(tmp_path / "b")), p1, resume="latest")
    for a, b in zip(full.nonlinearities.parameters(), again.nonlinearities.parameters()): assert torch.equal(a, b)
    for a, b in zip(full.ensemble.weight_parameters(), again.ensemble.weight_parameters()): assert torch.equal(a, b)
    pd.testing.assert_frame_equal(full.metrics, again.metrics)
    assert (full.best_step, again.best_step) == (again.best_step, full.best_step)
    with pytest.raises(CheckpointError, match="phase1"):
        phase1(task, ARCH, tcfg(steps=6), Phase1Config(n_models=2, spline_lr=0.05, arch_loss="train"),   # the spline lr may change, the rest not
               resume=tmp_path / "a" / "step-00000002.safetensors")

    out = full.save(tmp_path / "saved")
    back = load_phase1(out)
    for a, b in zip(full.nonlinearities.parameters(), back.nonlinearities.parameters()): assert torch.equal(a, b)
    for a, b in zip(full.best.parameters(), back.best.parameters()): assert torch.equal(a, b)
    assert back.cost["steps"] == 6 and back.cost["n_models"] == 2 and back.cost["device"] == "cpu"
    assert back.config["phase1"]["spline_lr"] == 0.05 and back.config["data"]["name"] == "add"
    assert back.nonlinearities.frozen
    f = out / "nonlinearities.safetensors"; f.write_bytes(f.read_bytes()[:30])
    with pytest.raises(ValueError, match="corrupt"): load_phase1(out)


def test_phase1_needs_splines_and_splits(task):
    with pytest.raises(ValueError, match="mlp_act='spline'"): phase1(task, standard_arch(ARCH), tcfg())


def test_phase2_freezes_and_baseline_is_standard(task):
    src = phase1(task, ARCH, tcfg(steps=2), Phase1Config(n_models=2, spline_lr=0.05))
    before = [p.clone() for p in src.nonlinearities.parameters()]
    p2 = phase2(task, src, ARCH, tcfg(), seeds=[0, 1])
    assert p2.model.nonlinearities.frozen
    for a, b in zip(before, p2.model.nonlinearities.parameters()): assert torch.equal(a, b)
    base = baseline(task, ARCH, tcfg(), seeds=[0, 1])
    assert (base.model.cfg.mlp_act, base.model.cfg.attn_fn) == ("gelu", "softmax")
    cmp = compare(pd.concat([base.metrics, p2.metrics]), threshold=0.0)
    assert list(cmp.model) == ["standard", "learned"] and (cmp.reached == 2).all()
    assert cmp.speedup.tolist() == [1.0, 1.0]    # both reach accuracy 0 at step 0


def _metrics_reaching(arms:dict)->pd.DataFrame:
    "Tidy test-accuracy curves: arm -> {seed: step at which accuracy jumps from 0.5 to 1.0 (None: never)}, evaluated every 50 steps."
    rows = [{"step": t, "model": arm, "seed": seed, "split": "test", "metric": "seq_acc",
             "value": 1.0 if at is not None and t >= at else 0.5}
            for arm, seeds in arms.items() for seed, at in seeds.items() for t in range(0, 501, 50)]
    return pd.DataFrame(rows)


def test_compare_speedup_is_the_ratio_of_median_steps():
    "The speed-up is the reference's median steps over the arm's, at a real threshold; seeds that never reach count as infinitely slow."
    m = _metrics_reaching({"standard": {0: 400, 1: 300, 2: None}, "learned": {0: 100, 1: 200, 2: 150}})
    cmp = compare(m, "standard", threshold=0.95).set_index("model")
    assert cmp.loc["standard", "reached"] == 2 and cmp.loc["learned", "reached"] == 3
    assert cmp.loc["learned", "median_steps"] == 150 and cmp.loc["standard", "median_steps"] == 400
    assert cmp.loc["learned", "speedup"] == pytest.approx(400 / 150) and cmp.loc["standard", "speedup"] == 1.0
    slow = compare(_metrics_reaching({"standard": {0: 100, 1: 100}, "learned": {0: None, 1: None}}), "standard", 0.95).set_index("model")
    assert slow.loc["learned", "speedup"] == 0.0   # never reached: no speed-up at all


def test_assemble_transfer_reads_any_cells_in_any_order(task):
    "The one transfer-matrix implementation: cells' metrics in any order, per-target thresholds, lower medians, the standard row first."
    src = phase1(task, ARCH, tcfg(steps=2), Phase1Config(n_models=2))
    targets = {"add": task, "copy": get_task("copy", seed=0, n_symbols=4, train_lengths=(2, 4), arch_lengths=(2, 5), test_lengths=(6, 7))}
    cfg = tcfg(steps=2, eval_examples=16)
    results = [(baseline(targets[t], ARCH, cfg, seeds=[0, 1]) if row == "standard" else phase2(targets[t], src, ARCH, cfg, seeds=[0, 1], name=row)
                ).metrics.assign(target=t) for row in ("standard", "add") for t in targets]
    tm = assemble_transfer(results[::-1], threshold=0.0)     # order does not matter
    assert list(tm.speedup.index) == ["standard", "add"] and sorted(tm.speedup.columns) == ["add", "copy"]
    assert tm.heatmap("final_id").data[0].z.shape == (2, 2)
    fin = pd.concat(results).query("split == 'test' and metric == 'seq_acc' and step == 2")
    for (row, t), g in fin.groupby(["model", "target"]):   # two seeds: the lower of the two, a value some seed has
        assert tm.final_id.loc[row, t] == sorted(g.value)[0]
    never = assemble_transfer(results, threshold={"add": 1.01, "copy": 0.0})   # a target's own threshold: nothing reaches 101%
    assert never.median_steps["add"].isna().sum() == 0 and np.isinf(never.median_steps["add"]).all()
    assert (never.speedup["add"] == 1.0).all() and (never.median_steps["copy"] == 0).all()


# ---------------------------------------------------------------- issue 14: nothing lost, nothing silent
class Kill(Exception): pass

def kill_at(step):
    def cb(rows):
        if int(rows.step.iloc[0]) == step: raise Kill(step)
    return cb


def same_weights(a, b):
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()): assert torch.equal(x, y), k


@pytest.fixture(scope="module")
def source(task):
    return phase1(task, ARCH, tcfg(steps=2), Phase1Config(n_models=2, spline_lr=0.05))


def test_phase2_arms_checkpoint_apart_and_resume_exactly(task, source, tmp_path, capsys):
    full = phase2(task, source, ARCH, tcfg(steps=6), seeds=[0, 1])
    cfg = tcfg(steps=6, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    with pytest.raises(Kill): phase2(task, source, ARCH, cfg, seeds=[0, 1], callbacks=[kill_at(4)])
    base = baseline(task, ARCH, cfg, seeds=[0, 1])          # the other arm, same checkpoint_dir
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learned", "standard"]
    assert list_checkpoints(tmp_path / "learned")[-1].name == "step-00000004.safetensors"
    assert list_checkpoints(tmp_path / "standard")[-1].name == "step-00000006.safetensors"
    again = phase2(task, source, ARCH, cfg, seeds=[0, 1], resume=True)
    assert (again.steps, again.steps_run) == (6, 2)
    same_weights(full.model, again.model)
    pd.testing.assert_frame_equal(full.metrics, again.metrics)
    b2 = baseline(task, ARCH, cfg, seeds=[0, 1], resume=True)   # a finished arm resumes to its end: nothing to do
    assert b2.steps_run == 0
    pd.testing.assert_frame_equal(base.metrics, b2.metrics)
    with pytest.raises(CheckpointError, match="different run"): phase2(task, source, ARCH, cfg, seeds=[0, 2], resume=True)
    with pytest.raises(CheckpointError, match="different run"): phase2(task, source, ARCH, cfg, seeds=[0, 1], resume=True, seed=9)
    other = Nonlinearities.from_config(arch_for(task, ARCH))            # other learned splines are another run too
    with pytest.raises(CheckpointError, match="different run"): phase2(task, other, ARCH, cfg, seeds=[0, 1], resume=True)
    capsys.readouterr()
    baseline(task, ARCH, tcfg(steps=2, checkpoint_dir=str(tmp_path / "new")), seeds=[0], resume=True)
    assert f"no checkpoint in {tmp_path / 'new' / 'standard'}; starting from step 0" in capsys.readouterr().err


def test_default_seeds_are_disjoint_and_overlap_is_refused(task, source, tmp_path):
    import inspect
    assert Phase1Config().seeds == tuple(range(100, 108)) and Phase1Config(n_models=3).seeds == (100, 101, 102)
    from spline_transformers.runner import run_transfer
    for f in (phase2, baseline, run_transfer):
        assert not set(inspect.signature(f).parameters["seeds"].default) & set(Phase1Config(n_models=64).seeds)
    with pytest.raises(ValueError, match=r"overlap the Phase I seeds \[100, 101\]"): phase2(task, source, ARCH, tcfg(), seeds=[0, 101])
    folder = source.save(tmp_path / "p1")
    with pytest.raises(ValueError, match="overlap the Phase I seeds"): phase2(task, folder, ARCH, tcfg(), seeds=[100])
    with pytest.raises(ValueError, match="overlap the Phase I seeds"):
        phase2(task, folder / "best.safetensors", ARCH, tcfg(), seeds=[100])
    with pytest.raises(ValueError, match="overlap the Phase I seeds"):
        run_transfer({"add": folder}, {"add": ("add", {})}, ARCH, tcfg(), tmp_path / "tm", seeds=[100], log=None)   # before any cell
    assert not (tmp_path / "tm").exists()


def test_the_spline_learning_rate_has_one_home(task):
    "Issue 24: Phase1Config is the spline optimiser's one home; TrainConfig has no spline fields, and its dicts (hashed by the experiments, kept in checkpoints) keep the old keys at their old values."
    from dataclasses import fields
    from spline_transformers.train import RESUME_CHANGEABLE, make_optimizer
    assert not {"spline_lr", "spline_betas"} & {f.name for f in fields(TrainConfig)}
    assert {"spline_lr", "spline_betas"} <= {f.name for f in fields(Phase1Config)}
    with pytest.raises(TypeError): TrainConfig(spline_lr=0.5)
    d = tcfg().to_dict()
    assert d["spline_lr"] is None and d["spline_betas"] == [0.99, 0.999]   # the serialised form of before: hashes and cell keys unchanged
    assert TrainConfig.from_dict(d) == tcfg() and TrainConfig.from_dict({k: v for k, v in d.items() if not k.startswith("spline")}) == tcfg()
    with pytest.raises(ValueError, match="Phase1Config.spline_lr"): TrainConfig.from_dict({**d, "spline_lr": 0.5})
    with pytest.raises(ValueError, match="Phase1Config.spline_betas"): TrainConfig.from_dict({**d, "spline_betas": [0.9, 0.9]})
    assert RESUME_CHANGEABLE == ("train.lr", "run.phase1.spline_lr")
    from spline_transformers.model import Transformer   # `train`'s trainable splines: one AdamW group, the weights' lr and betas, no decay
    cfg = tcfg(lr=2e-3)
    opt = make_optimizer(Transformer(arch_for(task, ARCH)), cfg)
    assert [(g["lr"], g["betas"], g["weight_decay"]) for g in opt.param_groups][-1] == (2e-3, cfg.betas, 0.0)
    res = phase1(task, ARCH, tcfg(steps=1), Phase1Config(n_models=2, spline_lr=0.05, spline_betas=(0.9, 0.95)))   # Phase I reads Phase1Config
    assert res.config["phase1"]["spline_lr"] == 0.05 and res.config["train"]["spline_lr"] is None


@pytest.mark.parametrize("text, words", [
    ("[1, 2]", ["JSON list", "an object"]),
    ('{"format": "spline_transformers.phase1/1", "cost": {}}', ["missing", "best_step"]),
    ('{"format": "spline_transformers.phase1/1", "best_step": 3, "cost": []}', ["cost", "object"]),
    ("{not json", ["not valid JSON"]),
])
def test_load_phase1_names_the_file_and_the_fix(task, tmp_path, text, words):
    "A malformed phase1.json is a ValueError naming the file and what to do, never an AttributeError or KeyError."
    out = phase1(task, ARCH, tcfg(steps=2), Phase1Config(n_models=2)).save(tmp_path / "p1")
    (out / "phase1.json").write_text(text)
    with pytest.raises(ValueError) as e: load_phase1(out)
    msg = str(e.value)
    assert str(out / "phase1.json") in msg and "re-run phase1" in msg, msg
    for w in words: assert w in msg, msg


def test_transfer_matrix_saves_itself(task, tmp_path):
    "Writing a transfer matrix belongs to the matrix: one CSV per matrix and the metrics."
    src = phase1(task, ARCH, tcfg(steps=2), Phase1Config(n_models=2))
    tm = assemble_transfer([baseline(task, ARCH, tcfg(), seeds=[0]).metrics.assign(target="add"),
                            phase2(task, src, ARCH, tcfg(), seeds=[0], name="s").metrics.assign(target="add")])
    out = tm.save(tmp_path / "tm")
    for k in ("speedup", "median_steps", "final_id", "final_ood"):
        back = pd.read_csv(out / f"{k}.csv", index_col=0)
        assert list(back.index) == list(getattr(tm, k).index) == ["standard", "s"], k
    assert len(pd.read_csv(out / "metrics.csv")) == len(tm.metrics)


def test_one_figure_draws_learned_splines_with_both_references(task):
    "`nonlinearities_figure` draws MLP splines beside GeLU and attention kernels beside exp; the report draws the same."
    from spline_transformers import report
    from spline_transformers.model import nonlinearities_figure
    nl = Nonlinearities.from_config(arch_for(task, ARCH))
    fig = nonlinearities_figure(nl, others={"best": nl})
    names = {t.name for t in fig.data}
    assert {"GeLU", "exp (softmax), scaled", "learned", "best"} <= names, names
    assert not hasattr(report, "splines_figure")   # one function, not two with different references
    import ast, inspect   # issue 24: the figure lives beside Nonlinearities, and the report does not import two_phase to draw
    assert "two_phase" not in {n.module for n in ast.walk(ast.parse(inspect.getsource(report))) if isinstance(n, ast.ImportFrom)}


def test_demo_result_writes_its_whole_folder(task, tmp_path):
    "One room writes the demo's folder: `DemoResult.save` writes every data file, with the caller's extra entries in config.json."
    import json
    from spline_transformers.train import steps_to_threshold
    from spline_transformers.two_phase import DemoResult, demo_config
    src = phase1(task, ARCH, tcfg(steps=2), Phase1Config(n_models=2))
    m = pd.concat([baseline(task, ARCH, tcfg(), seeds=[0], name="standard").metrics,
                   phase2(task, src, ARCH, tcfg(), seeds=[0], name="learned").metrics], ignore_index=True)
    res = DemoResult(demo_config("cpu"), steps_to_threshold(m, "seq_acc", 0.95, "test"), compare(m, "standard"), m, src, {"device": "cpu"})
    out = res.save(tmp_path / "demo", command="spline-transformers demo", wall_time_s=1.5)
    assert {p.name for p in out.iterdir()} == {"phase1", "nonlinearities.safetensors", "nonlinearities.json", "metrics.csv",
                                                "summary.csv", "steps_to_threshold.csv", "config.json"}
    info = json.loads((out / "config.json").read_text())
    assert info["command"] == "spline-transformers demo" and info["wall_time_s"] == 1.5 and info["demo"]["task"] == "add"
    back = Nonlinearities.load(out / "nonlinearities.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(back.parameters(), src.nonlinearities.parameters()))
    assert load_phase1(out / "phase1").best_step == src.best_step


def test_phase1_resumes_a_divergence_with_lower_lr_and_spline_lr(task, tmp_path):
    "Issue 29 D2: a Phase I run blown up by huge learning rates resumes from its last good checkpoint with lower lr and spline_lr; both are used and recorded, and it trains past the divergence."
    import math
    from spline_transformers.train import TrainingDiverged, load_state
    cfg = tcfg(steps=24, lr=100.0, eval_every=8, checkpoint_dir=str(tmp_path), checkpoint_every=1)
    with pytest.raises(TrainingDiverged, match="spline_lr") as e:
        phase1(task, ARCH, cfg, Phase1Config(n_models=2, seeds=(3, 4), spline_lr=1e10))
    ck = e.value.checkpoint
    assert ck is not None, str(e.value)
    saved = load_state(ck)["state"]
    res = phase1(task, ARCH, replace(cfg, lr=1e-3), Phase1Config(n_models=2, seeds=(3, 4), spline_lr=0.01), resume=ck)
    assert res.cost["steps"] == 24 > e.value.step
    m = res.metrics
    assert m[m.metric == "loss"].value.map(math.isfinite).all()
    rows = m[m.metric.isin(["lr", "spline_lr"])]
    assert sorted(set(zip(rows.metric, rows.value, rows.step))) == [("lr", 1e-3, saved["step"]), ("spline_lr", 0.01, saved["step"])]
    # the splines moved by Adam steps of at most ~0.01, not 1e10
    names = [k for k in saved["module"] if k.startswith("nonlinearities.")]
    now = dict(res.ensemble.state_dict())
    assert names and max(float((now[k] - saved["module"][k]).abs().max()) for k in names) < 1.0


@pytest.mark.slow
def test_demo_arm_processes_exchange_no_pickle(task, tmp_path):
    "Issue 29: the demo's arm processes get their orders and send their results back as JSON, safetensors and CSV, never pickle; the results equal an in-process run."
    import re
    from pathlib import Path
    import spline_transformers.two_phase as tp
    import spline_transformers.core as core
    for m in (tp, core):   # the demo's process code, and the one process runner
        assert not re.search(r"\bimport pickle\b|\bpickle\.|multiprocessing", Path(m.__file__).read_text()), f"{m.__name__} uses pickle"
    c = tp.quick_demo_config("cpu")
    c = replace(c, train=replace(c.train, steps=4, eval_every=2, eval_examples=16, batch_size=8), seeds=(0,))
    p1 = phase1(task, ARCH, tcfg(steps=2), Phase1Config(n_models=2))
    c = replace(c, arch=arch_for(task, ARCH))
    arms = tp._start_arms()
    try: got = tp._finish_arms(arms, tmp_path, c, replace(p1, ensemble=None))
    finally:
        for p in arms.values(): p.stop()
    names = {p.suffix for p in tmp_path.rglob("*") if p.is_file()}
    assert names <= {".json", ".csv", ".safetensors"}, names
    for arm, r, source in zip(("learned", "standard"), got, (p1, None)):
        ref = tp._demo_arm(arm, c, source)
        pd.testing.assert_frame_equal(ref.metrics, r.metrics, check_exact=True)
        assert (r.steps, r.steps_run, r.config) == (ref.steps, ref.steps_run, ref.config) and r.wall_time > 0


def test_demo_arm_errors_come_back_as_their_types(task, tmp_path):
    "Issue 24: an arm process's `TrainingDiverged` comes back as itself with its step and checkpoint; a built-in error as itself; the others as a RuntimeError naming them."
    import sys
    from pathlib import Path
    import spline_transformers.two_phase as tp
    from spline_transformers.train import TrainingDiverged
    c = tp.quick_demo_config("cpu")
    c = replace(c, arch=arch_for(task, ARCH), seeds=(0,),
                train=replace(c.train, steps=6, eval_every=2, eval_examples=16, batch_size=8, lr=1e12, warmup=0))
    p1 = phase1(task, ARCH, tcfg(steps=2), Phase1Config(n_models=2))
    arms = tp._start_arms()
    try:
        with pytest.raises(TrainingDiverged) as e: tp._finish_arms(arms, tmp_path / "arms", c, replace(p1, ensemble=None))
    finally:
        for p in arms.values(): p.stop()
    assert isinstance(e.value.step, int) and e.value.checkpoint is None and "step" in str(e.value)
    if sys.version_info >= (3, 11): assert any("the demo's 'learned' arm" in n for n in e.value.__notes__)   # the child's traceback
    report = {"type": "TrainingDiverged", "module": "spline_transformers.train", "message": "m", "traceback": "",
              "attrs": {"step": 3, "checkpoint": str(tmp_path / "ck" / "step-2")}}
    back = tp._diverged(report)
    assert isinstance(back, TrainingDiverged) and (back.step, back.checkpoint, str(back)) == (3, tmp_path / "ck" / "step-2", "m")
    assert tp._diverged({**report, "type": "ValueError", "module": "builtins"}) is None   # left to core: a ValueError as itself


def test_pre_qkv_spline_learns_in_phase1_and_loads_frozen_in_phase2(task):
    "Issue 27: the pre-QKV residual spline's values and scalars a, b learn in Phase I (shared by the M models) and Phase II uses them frozen."
    from spline_transformers.splines import init_values
    arch = replace(ARCH, mlp_act="gelu", attn_fn="softmax", pre_qkv_spline=True, mlp_init="gelu")
    src = phase1(task, arch, tcfg(steps=3), Phase1Config(n_models=2, spline_lr=0.05))
    nl = src.nonlinearities
    assert (len(nl.mlp), len(nl.attn), len(nl.pre_qkv)) == (0, 0, 1)
    s = nl.pre_qkv[0]
    assert s.a.item() != 1.0 and s.b.item() != 0.0 and not torch.equal(s.values, init_values("gelu", s.knots))
    p2 = phase2(task, src, replace(ARCH, mlp_act="gelu", attn_fn="softmax"), tcfg(), seeds=[0, 1])   # the arch need not say pre_qkv_spline
    assert p2.model.cfg.pre_qkv_spline and p2.model.nonlinearities.frozen
    for a, b in zip(nl.parameters(), p2.model.nonlinearities.parameters()): assert torch.equal(a, b)
    with pytest.raises(ValueError, match="pre_qkv_spline"): phase1(task, replace(arch, pre_qkv_spline=False), tcfg())
