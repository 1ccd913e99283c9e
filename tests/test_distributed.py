"""Distributed Phase I and transfer matrix: 2 processes on CPU (gloo) launched with torchrun, compared with one process.

Every job runs under `launch`, which kills the whole torchrun process group after a timeout, so a hang fails the test
instead of blocking the suite. Sizes are tiny: the wall time is mostly interpreter and torch start-up.
"""
import os, shlex, time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from spline_transformers.distributed import (launch, shard, shard_sizes, torchrun_command, init_distributed, is_distributed,
                                             launched_world_size, distributed_phase1,
                                             rank_checkpoint_dir, agreed_resume, GradAllReduce, FAULT_ENV, _parse_fault)
from spline_transformers.cli import build_parser, arch_from_args, train_from_args
from spline_transformers.core import atomic_write
from spline_transformers.model import Nonlinearities
from spline_transformers.tasks import get_task
from spline_transformers.two_phase import phase1, Phase1Config, load_phase1, arch_for
from spline_transformers.runner import run_transfer

TASK = "--task add --task-param n_digits=3 --task-param ood_digits=[4,5]"
SIZES = "--pos alibi --d-model 32 --n-layers 1 --n-heads 2 --batch-size 16 --warmup 0 --device cpu --no-progress"   # tiny: start-up dominates
PHASE1 = f"phase1 {TASK} {SIZES} --n-knots 16 --n-models 3 --steps 6 --eval-every 3 --eval-examples 32 --backend gloo --timeout 120"
TRANSFER = f"transfer --targets add --task-param n_digits=3 --task-param ood_digits=[4,5] {SIZES} --seeds 0,1 --steps 4 --eval-every 4 --eval-examples 32 --backend gloo --timeout 120"
TOL = 1e-5
JOB_TIMEOUT = 300  # seconds before a job (and every process it started) is killed; generous: shared CI machines are slow


def _args(s): return shlex.split(s)

def _run(args, **kw):
    t0 = time.perf_counter()
    r = launch(_args(args), nproc_per_node=2, timeout=JOB_TIMEOUT, **kw)
    wall = time.perf_counter() - t0
    print(f"\n[{args.split()[0]}] 2-rank torchrun job: {wall:.1f} s wall, exit code {r.returncode}")
    return r, wall

def _max_diff(a, b): return max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(a.parameters(), b.parameters()))

def _same_metrics(ref, got):
    k = ["step", "model", "split", "metric", "seed"]
    x, y = ref.sort_values(k).reset_index(drop=True), got.sort_values(k).reset_index(drop=True)
    assert len(x) == len(y) and (x[k].astype(str) == y[k].astype(str)).all().all(), "the two runs recorded different metric rows"
    return float((x.value - y.value).abs().max())


@pytest.fixture(scope="module")
def reference():
    "The same Phase I in this process, with the plain single-process `phase1`."
    torch.set_num_threads(1)
    a = build_parser().parse_args(_args(PHASE1))   # the same command line, in this process
    return phase1(get_task("add", n_digits=3, ood_digits=(4, 5)), arch_from_args(a), train_from_args(a), Phase1Config(n_models=3))


@pytest.mark.slow
def test_phase1_two_ranks_match_one_process(tmp_path, reference):
    r, wall = _run(f"{PHASE1} --out {tmp_path / 'out'}")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "3 models on 2 ranks (gloo)" in r.stdout
    got = load_phase1(tmp_path / "out")
    assert got.cost["world_size"] == 2 and got.cost["n_models"] == 3 and got.cost["spline_drift"] == 0.0
    assert _max_diff(reference.nonlinearities, got.nonlinearities) < TOL
    assert got.best_step == reference.best_step and _max_diff(reference.best, got.best) < TOL
    assert _same_metrics(reference.metrics, got.metrics) < TOL
    assert set(got.metrics.seed) == {100, 101, 102}   # the default Phase I seeds


@pytest.mark.slow
def test_killed_rank_stops_the_job_and_resume_finishes_the_run(tmp_path, reference):
    ck, out = tmp_path / "ck", tmp_path / "out"
    args = f"{PHASE1} --checkpoint-dir {ck} --checkpoint-every 2 --out {out}"
    r, wall = _run(args, env={FAULT_ENV: "rank=1,step=4"})   # rank 1 is SIGKILLed at step 4, after the step-2 checkpoint
    assert r.returncode != 0, "the job must fail when a rank dies"
    assert wall < JOB_TIMEOUT - 10, f"the job must stop by itself, not by the test's timeout\n{r.stderr[-6000:]}"
    assert "SIGKILL" in r.stderr or "Signal 9" in r.stderr, r.stderr[-3000:]   # torchrun names the dead rank
    assert sorted(p.name for p in out.iterdir()) == [".lock"]   # no result: only the lock rank 0 held on --out (D9)
    assert (rank_checkpoint_dir(ck, 0, 2) / "step-00000002.safetensors").is_file()
    r, wall = _run(args + " --resume")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "resumed from step-00000002.safetensors" in r.stdout
    got = load_phase1(out)
    assert _max_diff(reference.nonlinearities, got.nonlinearities) < TOL
    assert got.best_step == reference.best_step and _max_diff(reference.best, got.best) < TOL
    assert _same_metrics(reference.metrics, got.metrics) < TOL


@pytest.mark.slow
def test_transfer_two_ranks_match_one_process(tmp_path):
    torch.set_num_threads(1)
    a = build_parser().parse_args(_args(TRANSFER) + ["--source", "s=x"])
    cfg = train_from_args(a)
    task = get_task("add", n_digits=3, ood_digits=(4, 5))
    nl = Nonlinearities.from_config(arch_for(task, replace(arch_from_args(a), mlp_act="spline", attn_fn="spline", n_knots=16)))
    with torch.no_grad():
        for p in nl.parameters(): p.add_(torch.linspace(-0.5, 0.5, p.numel()).view_as(p))
    path = nl.save(tmp_path / "src.safetensors")
    r, wall = _run(f"{TRANSFER} --source s={path} --out {tmp_path / 'out'}")
    assert r.returncode == 0, r.stderr[-4000:]
    ref = run_transfer({"s": str(path)}, {"add": ("add", {"n_digits": 3, "ood_digits": [4, 5]})}, nl.config_for(arch_from_args(a)), cfg,
                       tmp_path / "one", seeds=(0, 1), log=None)   # the one runner, in one-thread processes
    got = pd.read_csv(tmp_path / "out" / "metrics.csv")
    assert _same_metrics(ref.metrics, got) < TOL
    for k in ("median_steps", "final_id", "final_ood"):
        m = pd.read_csv(tmp_path / "out" / f"{k}.csv", index_col=0)
        assert list(m.index) == list(getattr(ref, k).index) == ["standard", "s"]
        assert np.allclose(m.values.astype(float), getattr(ref, k).values.astype(float), atol=TOL, equal_nan=True), (k, m, getattr(ref, k))


@pytest.mark.slow
def test_failed_job_prints_one_line_per_rank(tmp_path):
    "A user error on every rank: one error line per rank that got to it, naming the rank, and no traceback of ours."
    r, wall = _run(PHASE1.replace("--n-models 3", "--n-models 1") + f" --out {tmp_path / 'out'}")
    assert r.returncode != 0
    lines = [l for l in r.stderr.splitlines() if "cannot be shared by 2 ranks" in l]
    # torchrun stops the other rank when the first exits, so the slower one may be stopped before it prints
    ranks = [l.split(":")[0] for l in lines]
    assert 1 <= len(ranks) == len(set(ranks)) and set(ranks) <= {"spline-transformers phase1 (rank 0)", "spline-transformers phase1 (rank 1)"}, r.stderr[-3000:]
    assert "Gloo" not in r.stderr and "failed: RuntimeError" not in r.stderr, r.stderr[-3000:]   # refused before joining, not mid-connect
    assert "spline_transformers/" not in r.stderr, r.stderr[-3000:]   # no frame of this package in any traceback


def test_user_errors_are_raised_before_joining_the_process_group(monkeypatch):
    "A rank that refused after joining would break its peers' connect (a gloo 'Connection closed by peer' instead of the user's error)."
    monkeypatch.setenv("WORLD_SIZE", "2")   # torchrun's environment, without RANK/MASTER_ADDR: joining would raise a RuntimeError
    for k in ("RANK", "MASTER_ADDR", "MASTER_PORT"): monkeypatch.delenv(k, raising=False)
    assert launched_world_size() == 2
    a = build_parser().parse_args(_args(PHASE1))
    task = get_task("add", n_digits=3, ood_digits=(4, 5))
    arch = replace(arch_from_args(a), mlp_act="spline", attn_fn="spline", n_knots=16)
    with pytest.raises(ValueError, match="cannot be shared by 2 ranks"):
        distributed_phase1(task, arch, train_from_args(a), Phase1Config(n_models=1, seeds=(0,)))
    with pytest.raises(NotImplementedError, match="staggered"):
        distributed_phase1(task, arch, train_from_args(a), Phase1Config(n_models=2, seeds=(0, 1), staggered=True))
    with pytest.raises(RuntimeError, match="not set"): init_distributed()   # the check above came first


def test_sharding_and_commands():
    assert shard_sizes(5, 2) == [3, 2] and shard_sizes(2, 3) == [1, 1, 0]
    assert shard(list(range(5)), 0, 2) + shard(list(range(5)), 1, 2) == list(range(5))
    with pytest.raises(ValueError, match="out of range"): shard([1], 2, 2)
    assert torchrun_command(["phase1"], 4)[:3] == ["torchrun", "--standalone", "--nproc_per_node=4"]
    multi = torchrun_command(["phase1"], 8, nnodes=2, rdzv_endpoint="node0:29500")
    assert "--nnodes=2" in multi and "--rdzv_endpoint=node0:29500" in multi and "--standalone" not in multi
    with pytest.raises(ValueError, match="rdzv_endpoint"): torchrun_command(["phase1"], 8, nnodes=2)
    assert _parse_fault("rank=1,step=4") == {"rank": 1, "step": 4}
    with pytest.raises(ValueError, match="rank=R,step=S"): _parse_fault("rank1")


def test_one_process_without_torchrun(tmp_path):
    "Outside torchrun everything degrades to a single process: no group, the hook is a no-op, resume reads this rank's folder."
    if any(k in os.environ for k in ("WORLD_SIZE", "MASTER_ADDR")): pytest.skip("running under a launcher")
    assert not is_distributed()
    info = init_distributed()
    assert (info.rank, info.world_size, info.backend) == (0, 1, None)
    p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.full((3,), 2.0)
    GradAllReduce()([p]); assert p.grad.tolist() == [2.0, 2.0, 2.0]
    assert agreed_resume(tmp_path, True, info) is None
    d = rank_checkpoint_dir(tmp_path, 0, 1); d.mkdir(parents=True)
    (d / "step-00000004.safetensors").write_bytes(b"x")
    assert agreed_resume(tmp_path, True, info).name == "step-00000004.safetensors"
    (rank_checkpoint_dir(tmp_path, 0, 2)).mkdir(); (rank_checkpoint_dir(tmp_path, 0, 2) / "step-00000002.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match="job with 2 ranks"): agreed_resume(tmp_path, True, info)


def test_transfer_outside_torchrun_runs_only_unfinished_cells(tmp_path, monkeypatch):
    "One process (no torchrun): distributed_transfer trains the cells, then on a second call finds them done and trains none."
    if any(k in os.environ for k in ("WORLD_SIZE", "MASTER_ADDR")): pytest.skip("running under a launcher")
    import spline_transformers.distributed as D
    a = build_parser().parse_args(_args(TRANSFER) + ["--source", "s=x"])
    task = get_task("add", n_digits=3, ood_digits=(4, 5))
    nl = Nonlinearities.from_config(arch_for(task, replace(arch_from_args(a), mlp_act="spline", n_knots=16)))
    path = nl.save(tmp_path / "src.safetensors")
    targets = {"add": ("add", {"n_digits": 3, "ood_digits": [4, 5]})}
    first = D.distributed_transfer({"s": str(path)}, targets, nl.config_for(arch_from_args(a)), train_from_args(a), tmp_path / "out", seeds=(0, 1))
    assert len(list((tmp_path / "out" / ".cells").glob("*/done.json"))) == 4
    def boom(*a, **k): raise AssertionError("run_cells must not be called for finished cells")
    monkeypatch.setattr(D, "run_cells", boom)
    again = D.distributed_transfer({"s": str(path)}, targets, nl.config_for(arch_from_args(a)), train_from_args(a), tmp_path / "out", seeds=(0, 1))
    pd.testing.assert_frame_equal(first.final_id, again.final_id)


CLI_PHASE1 = (f"phase1 {TASK} --n-models 3 --model-seeds 0,1,2 --steps 6 --eval-every 3 --eval-examples 32 --d-model 32 "
              "--n-layers 1 --n-heads 2 --n-knots 16 --backend gloo --device cpu --timeout 120 --no-progress")


@pytest.mark.slow
def test_cli_phase1_under_torchrun_matches_one_process(tmp_path):
    "The real entry point: `torchrun ... -m spline_transformers.cli phase1` on 2 ranks against the same command in one process."
    from spline_transformers.cli import main as cli_main
    t0 = time.perf_counter()
    r = launch(_args(f"{CLI_PHASE1} --out {tmp_path / 'dist'}"), nproc_per_node=2, timeout=JOB_TIMEOUT, module="spline_transformers.cli")
    print(f"\n[cli phase1] 2-rank torchrun job: {time.perf_counter() - t0:.1f} s wall, exit code {r.returncode}")
    assert r.returncode == 0, r.stderr[-4000:]
    torch.set_num_threads(1)
    assert cli_main(_args(f"{CLI_PHASE1} --out {tmp_path / 'one'}")) == 0
    one, got = load_phase1(tmp_path / "one"), load_phase1(tmp_path / "dist")
    assert got.cost["world_size"] == 2 and got.cost["n_models"] == 3
    assert _max_diff(one.nonlinearities, got.nonlinearities) < TOL
    assert got.best_step == one.best_step and _max_diff(one.best, got.best) < TOL
    assert _same_metrics(one.metrics, got.metrics) < TOL
    assert (tmp_path / "dist" / "report.html").is_file()
