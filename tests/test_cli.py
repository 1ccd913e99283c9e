"""The `spline-transformers` command: `demo --quick` as a real subprocess (files, printed table, the HTML report in headless
Chromium with every figure drawn, no page error and no request leaving the machine), every sub-command's error paths
(exit status 2 with a message naming the valid options), `interpolate` on a real dataset file, `prepare` on a small real
corpus, tiny `phase1` -> `phase2` -> `transfer` runs on files the previous command wrote, and `phase1` under torchrun."""
import html, json, os, re, shutil, subprocess, sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from spline_transformers import cli
from spline_transformers.cli import main, build_parser, UsageError, parse_ints, seed_list
from spline_transformers.two_phase import quick_demo_config
from spline_transformers.model import Nonlinearities
from spline_transformers.experiments import EXPERIMENTS, cells
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
@pytest.mark.parametrize("cmd", ["demo", "phase1", "phase2", "transfer", "interpolate", "prepare", "reproduce"])
def test_every_command_has_help(cmd, capsys):
    code, out, _ = run([cmd, "--help"], capsys)
    assert code == 0
    assert f"spline-transformers {cmd}" in out and len(out) > 300


def test_top_level_help_lists_the_commands(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    for cmd in ("demo", "phase1", "phase2", "transfer", "interpolate", "prepare", "reproduce"): assert cmd in out


def test_no_command_is_a_usage_error(capsys):
    code, _, err = run([], capsys)
    assert code == 2 and "COMMAND" in err


@pytest.mark.slow
def test_python_dash_m_runs_the_cli():
    p = subprocess.run([sys.executable, "-m", "spline_transformers.cli", "interpolate", "--help"], capture_output=True, text=True,
                       env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Hausdorff" in p.stdout


def test_the_command_line_starts_without_the_widget_stack():
    "Importing the command line (every `spline-transformers` start) loads no widget machinery: plotly's FigureWidget pulls in"
    " nbformat and jsonschema, whose IRI grammar alone took 6 CPU s of every start (10 s in all, 3.5 s without them)."
    code = "import sys, spline_transformers.cli; print(sorted(m for m in ('ipywidgets', 'nbformat', 'jsonschema', 'plotly.graph_objs._figurewidget') if m in sys.modules))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", p.stdout


def test_one_parser_and_its_defaults_are_the_configs():
    "Every training command's options come from the config dataclasses; a default differs only where CLI_DEFAULTS says so."
    from dataclasses import fields
    from spline_transformers.model import TransformerConfig
    from spline_transformers.train import TrainConfig
    from spline_transformers.two_phase import Phase1Config
    src = ROOT / "spline_transformers"
    assert [f.name for f in sorted(src.glob("*.py")) if "ArgumentParser(" in f.read_text()] == ["cli.py"]   # one command line
    ref = {TransformerConfig: TransformerConfig(vocab_size=1), TrainConfig: TrainConfig(), Phase1Config: Phase1Config()}
    for argv in (["phase1", "--task", "add"], ["phase2", "--task", "add", "--nonlinearities", "x"], ["transfer", "--source", "a=x"]):
        a = build_parser().parse_args(argv)
        built = [cli.arch_from_args(a), cli.train_from_args(a)] + ([cli.phase1_from_args(a)] if argv[0] == "phase1" else [])
        differ = {f.name for got in built for f in fields(got) if f.name != "vocab_size" and getattr(got, f.name) != getattr(ref[type(got)], f.name)}
        assert differ <= set(cli.CLI_DEFAULTS), (argv[0], differ - set(cli.CLI_DEFAULTS))
        assert differ == ({"mlp_act", "attn_fn", "progress"} if argv[0] == "phase1" else {"progress"}), (argv[0], differ)
    assert set(cli.CLI_DEFAULTS) == {"mlp_act", "attn_fn", "progress", "n_models"} and all(why for _, why in cli.CLI_DEFAULTS.values())
    helps = {act.dest: act.help for act in build_parser()._subparsers._group_actions[0].choices["phase1"]._actions}
    from fastcore.docments import docments
    assert docments(TrainConfig)["weight_decay"] in helps["weight_decay"]   # the help is the field's docment
    a = build_parser().parse_args(["phase1", "--task", "add", "--spline-lr", "0.05"])   # issue 24: --spline-lr sets the one home, Phase1Config
    assert cli.phase1_from_args(a).spline_lr == 0.05 and not hasattr(cli.train_from_args(a), "spline_lr")


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


@pytest.mark.slow
def test_reproduce_list_shows_contrasts_and_register_takes_their_names(capsys):
    code, out, err = run(["reproduce", "--list"], capsys)
    assert code == 0, err
    assert "code_vs_english_authors contrast (difference) of afs_code_bpe: own_mlp − gelu, afs_shakespeare_bpe: own_mlp − gelu" in out
    assert "attn_pre_qkv_code_no_gain contrast (no_gain) of afs_code_bpe: afs_mlp_attn − afs_mlp" in out
    code, _, err = run(["reproduce", "code_vs_fortran", "--register"], capsys)   # contrast names are valid here, and listed
    assert code == 2 and "experiment or contrast" in err and "code_vs_english_ours" in err and "add" in err
    code, _, err = run(["reproduce", "code_vs_english_ours", "--redecide"], capsys)   # a contrast has no folder to decide again
    assert code == 2 and "unknown experiment" in err


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
    from spline_transformers.two_phase import Phase1Config
    assert set(m.seed) == set(Phase1Config(n_models=2).seeds) and {"test", "arch"} <= set(m.split)   # the library's default seeds
    page = (phase1_dir / "report.html").read_text()
    assert page.count("plotly.js v") == 1 and "Phase I: 2 models" in page


def test_phase2_with_saved_splines(phase1_dir, tmp_path, capsys):
    out = tmp_path / "p2"
    code, stdout, err = run(["phase2", *TASK, "--nonlinearities", phase1_dir, "--seeds", "2", "--n-layers", "1", "--d-model", "16",
                             "--n-heads", "2", *TINY_TRAIN, "--out", out], capsys)
    assert code == 0, err
    m = pd.read_csv(out / "metrics.csv")
    from spline_transformers import two_phase
    assert set(m.model) == {"learned", "standard"} and set(m.seed) == set(seed_list([2], two_phase.PHASE2_SEEDS))   # the library's seeds
    s = pd.read_csv(out / "summary.csv")
    assert set(s.model) == {"learned", "standard"} and "speedup" in s
    from spline_transformers.report import comparison_verdict
    v = comparison_verdict(m, 0.95)               # the verdict printed is the registered rule's, from the metrics written
    assert v["text"] in stdout and v["verdict"] == "underpowered"   # 2 paired seeds
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
    assert len(list((out / ".cells").glob("*/done.json"))) == 4   # (2 rows x 2 targets x 1 seed) cells of the one runner
    code, stdout, err = run(["transfer", "--source", f"add={phase1_dir}", "--targets", "add,copy", "--seeds", "1",
                             "--n-layers", "1", "--d-model", "16", "--n-heads", "2", *TINY_TRAIN, "--out", out], capsys)
    assert code == 0, err
    assert "4 of 4 cells already done, 0 to run" in stdout   # a second run trains nothing again


@pytest.mark.slow
def test_phase1_under_torchrun(tmp_path):
    "WORLD_SIZE=2: the CLI's phase1 dispatches to distributed_phase1 (2 ranks, gloo), rank 0 writes the merged result."
    from spline_transformers.distributed import launch
    out = tmp_path / "dist"
    p = launch(["phase1", *TASK, *TINY_MODEL, *TINY_TRAIN, "--n-models", "2", "--backend", "gloo", "--out", str(out)],
               nproc_per_node=2, timeout=600, module="spline_transformers.cli")
    assert p.returncode == 0, p.stderr[-3000:]
    info = json.loads((out / "phase1.json").read_text())
    assert info["cost"]["world_size"] == 2 and info["cost"]["n_models"] == 2
    from spline_transformers.two_phase import Phase1Config
    assert set(pd.read_csv(out / "metrics.csv").seed) == set(Phase1Config(n_models=2).seeds)
    assert (out / "report.html").is_file() and p.stdout.count("phase1: 2 models") == 1     # only rank 0 reports


# ---------------------------------------------------------------- the demo, as a user runs it
@pytest.fixture(scope="module")
def quick_demo(demo_run):
    "`spline-transformers demo --quick --out <folder>` as a subprocess: the session's one run (`conftest.demo_run`)."
    out, p = demo_run
    assert p.args[-4:] == ["demo", "--quick", "--out", str(out)] and p.returncode == 0, p.stderr[-3000:]
    return out, p.stdout


def test_demo_quick_writes_the_files(quick_demo):
    "The demo is the registered experiment 'demo' at smoke size: the runner's result folder, its cells, and the report beside them."
    out, stdout = quick_demo
    for f in ("report.html", "demo/summary.json", "demo/metrics.csv.gz", "demo/phase1_metrics.csv.gz", "demo/provenance.json",
              "demo/splines/mlp_r0.safetensors", "demo/splines/mlp_r0.json"):
        assert (out / f).is_file(), f
    assert len(list((out / ".cells").glob("*/done.json"))) == len(cells(EXPERIMENTS["demo"], "smoke")) == 7
    nl = Nonlinearities.load(out / "demo" / "splines" / "mlp_r0.safetensors")
    arch = quick_demo_config().arch          # the demo learns the splines its architecture has, no more
    assert len(nl.mlp) == (arch.mlp_act == "spline") and len(nl.attn) == (arch.attn_fn == "spline") and len(nl.mlp) == 1
    from spline_transformers.splines import spline_backend
    kernel = spline_backend("cpu").name                 # the header and the report say which spline kernel ran
    assert f"spline kernel: {kernel}, " in stdout and f"Spline kernel: {kernel}, " in (out / "report.html").read_text()
    m = pd.read_csv(out / "demo" / "metrics.csv.gz")
    assert list(m.columns) == ["step", "model", "seed", "split", "metric", "value"]
    assert set(m.model) == {"learned", "standard"} and set(m.seed) == {0, 1, 2}
    assert {"test", "ood"} <= set(m.split) and "seq_acc" in set(m.metric)
    s = json.loads((out / "demo" / "summary.json").read_text())
    assert s["experiment"] == "demo" and s["size"] == "smoke" and s["config_hash"] == EXPERIMENTS["demo"].config_hash("smoke")
    assert len(s["per_seed"]) == 6 and s["verdicts"][0]["verdict"] == "underpowered"    # 3 seeds: fewer than the rule's 5
    prov = json.loads((out / "demo" / "provenance.json").read_text())
    assert prov["command"].endswith(f"demo --quick --out {out}") and prov["batched_seeds"] is True


def test_demo_quick_prints_the_table(quick_demo):
    out, stdout = quick_demo
    s = json.loads((out / "demo" / "summary.json").read_text())
    assert "Steps to 95% test sequence accuracy (add, evaluated every 20 steps" in stdout
    table = stdout[stdout.index("Steps to 95%"):]
    for row in ("seed 0", "seed 1", "seed 2", "standard", "learned", "median steps", "reached"): assert row in table
    v = s["verdicts"][0]                                 # the verdict printed is the one the result holds, with its why
    assert f"learned vs standard over 3 paired seeds: {v['verdict']}" in stdout and v["why"] in stdout
    ps = pd.DataFrame(s["per_seed"])
    line = next(l for l in table.splitlines() if l.startswith("standard"))
    for seed in (0, 1, 2):
        st = ps[(ps.arm == "standard") & (ps.seed == seed)].steps.iloc[0]
        assert ("never" if st is None else f"{st:.0f}") == line.split()[1 + seed]
    assert "Phase I: 2 models, 30 steps" in stdout and f"report: {out / 'report.html'}" in stdout


def test_demo_report_is_honest(quick_demo):
    out, _ = quick_demo
    page = (out / "report.html").read_text()
    s = json.loads((out / "demo" / "summary.json").read_text())
    v = s["verdicts"][0]
    assert f"{v['verdict']}: " in page and html.escape(v["rule"]) in page and html.escape(v["why"]) in page   # the registered rule, in words
    assert "Smoke size: a tiny run that checks the pipeline" in page     # --quick says its numbers are not evidence
    assert "Phase I: 2 models (seeds [100, 101]) sharing the splines, 30 steps" in page and "config " + s["config_hash"] in page


def test_demo_goes_through_the_runner(monkeypatch, tmp_path, capsys):
    "`demo` is `reproduce demo` with the demo's size (smoke with --quick, cpu on a CPU), two processes on 2+ cores, the folder as given."
    seen = []
    def stub(names, size, jobs, out, **k): seen.append((names, size, jobs, out, k)); raise KeyboardInterrupt
    monkeypatch.setattr(cli, "reproduce", stub)
    assert run(["demo", "--quick", "--out", tmp_path / "q"], capsys)[0] == 130
    assert run(["demo", "--out", tmp_path / "c", "--jobs", "1", "--resume"], capsys)[0] == 130
    (n1, s1, j1, o1, k1), (n2, s2, j2, o2, k2) = seen
    assert (n1, s1, o1, k1["resume"], k1["device"]) == (["demo"], "smoke", tmp_path / "q", False, "cpu")
    assert j1 == min(2, len(os.sched_getaffinity(0)))
    assert (n2, s2, j2, o2, k2["resume"]) == (["demo"], "cpu", 1, tmp_path / "c", True)


def test_demo_runs_again_from_its_cells(quick_demo, tmp_path, capsys):
    "A second `demo --quick` into the same folder trains nothing: the result is current, so it is kept and reported again."
    out, _ = quick_demo
    copy = tmp_path / "again"; shutil.copytree(out, copy)
    before = (copy / "demo" / "summary.json").read_text()
    code, stdout, err = run(["demo", "--quick", "--out", copy], capsys)
    assert code == 0, err
    assert "holds a current smoke result" in stdout and "0 to run" in stdout
    assert (copy / "demo" / "summary.json").read_text() == before and (copy / "report.html").is_file()


def test_demo_report_in_a_browser(quick_demo):
    "The report draws every figure offline: one inlined plotly.js, no page error, no request leaves the machine."
    require_browser()
    out, _ = quick_demo
    page_src = (out / "report.html").read_text()
    assert page_src.count("plotly.js v") == 1
    markup = re.sub(r"<script[^>]*>.*?</script>", "", page_src, flags=re.S)   # the page's own tags, without the scripts' text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", markup) and "@import" not in markup
    n_figs = page_src.count("Plotly.newPlot")
    assert n_figs >= 4                               # steps per seed, test curves, OOD curves, the learned splines
    with serve(out) as base, launch() as browser:
        page, errors, outside = open_page(browser, f"{base}/report.html", viewport={"width": 1300, "height": 900})
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n_figs}", timeout=60_000)
        drawn = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].map(d =>
                                   ({traces: d.data.length, paths: d.querySelectorAll('.scatterlayer .trace path').length}))""")
        assert len(drawn) == n_figs
        assert all(d["traces"] > 0 and d["paths"] > 0 for d in drawn), drawn
        assert "Every seed" in page.inner_text("body")
        page.context.close()
    assert errors == [], errors
    assert outside == [], outside


# ---------------------------------------------------------------- a corpus instead of a task
def test_phase1_and_phase2_on_a_small_corpus(tmp_path, capsys):
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


# ---------------------------------------------------------------- issue 14: nothing lost, nothing silent
import threading


class Worked(Exception):
    "Raised by a stand-in for the expensive step: reaching it means the command started its work."


@pytest.fixture
def no_work(monkeypatch):
    "Every expensive step of the commands fails the test if reached."
    def stop(*a, **k): raise Worked("the command started its work")
    for name in ("reproduce", "phase1", "phase2", "baseline", "run_transfer", "prepare", "load_corpus", "distributed_phase1", "distributed_transfer"):
        monkeypatch.setattr(cli, name, stop)
    import spline_transformers.interpolation as interp
    monkeypatch.setattr(interp, "interpolate_file", stop)


def _one_line_error(code, err):
    assert code == 2, err
    assert "Traceback" not in err and "error:" in err, err
    assert len(err.strip().splitlines()) == 1, err


def _command(cmd, out_flag, path, tmp_path, phase1_dir=None):
    "A command line of `cmd` that is otherwise valid, writing to `path` through `out_flag`."
    src = phase1_dir if phase1_dir is not None else tmp_path
    base = {"demo": ["demo", "--quick"],
            "phase1": ["phase1", *TASK, *TINY_MODEL, *TINY_TRAIN, "--n-models", "2"],
            "phase2": ["phase2", *TASK, "--nonlinearities", src, *TINY_TRAIN],
            "transfer": ["transfer", "--source", f"a={src}", "--targets", "add", *TINY_TRAIN],
            "prepare": ["prepare", "--corpus", "text", "--files", tmp_path]}[cmd]
    return [*base, out_flag, path]


def _one_kind_in_the_inner_loop(kinds)->list:
    "The first kind runs in the inner loop (`-m 'not slow'`), the others in the full suite."
    kinds = list(kinds)
    return kinds[:1] + [pytest.param(k, marks=pytest.mark.slow) for k in kinds[1:]]


BAD_OUTS = {"a file": lambda t: (t / "afile.txt", "file"),
            "under a file": lambda t: (t / "afile.txt" / "out", "file"),
            "unwritable": lambda t: (Path("/proc/1/no_such_folder/out"), "writ")}


@pytest.mark.parametrize("cmd", ["demo", "phase1", "phase2", "transfer", "prepare"])
@pytest.mark.parametrize("kind", _one_kind_in_the_inner_loop(BAD_OUTS))
def test_out_is_checked_before_any_work(cmd, kind, phase1_dir, tmp_path, no_work, capsys):
    if kind == "unwritable" and not Path("/proc/1").is_dir(): pytest.skip("needs Linux /proc")
    (tmp_path / "afile.txt").write_text("not a folder")
    (tmp_path / "doc.txt").write_text("a small document\n")
    path, word = BAD_OUTS[kind](tmp_path)
    code, _, err = run(_command(cmd, "--out", path, tmp_path, phase1_dir), capsys)
    _one_line_error(code, err)
    assert "--out" in err and str(path) in err and word in err


@pytest.mark.parametrize("cmd", ["phase1", "phase2", "transfer"])
@pytest.mark.parametrize("kind", _one_kind_in_the_inner_loop(BAD_OUTS))
def test_checkpoint_dir_is_checked_before_any_work(cmd, kind, phase1_dir, tmp_path, no_work, capsys):
    if kind == "unwritable" and not Path("/proc/1").is_dir(): pytest.skip("needs Linux /proc")
    (tmp_path / "afile.txt").write_text("not a folder")
    path, word = BAD_OUTS[kind](tmp_path)
    argv = _command(cmd, "--out", tmp_path / "out", tmp_path, phase1_dir) + ["--checkpoint-dir", path]
    code, _, err = run(argv, capsys)
    _one_line_error(code, err)
    assert "--checkpoint-dir" in err and str(path) in err and word in err


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_out_folder(tmp_path, no_work, capsys):
    ro = tmp_path / "ro"; ro.mkdir(); ro.chmod(0o500)
    try:
        code, _, err = run(["phase1", *TASK, *TINY_TRAIN, "--out", ro / "out"], capsys)
    finally: ro.chmod(0o700)
    _one_line_error(code, err)
    assert "writ" in err


def test_task_params_follow_the_task_types():
    t = lambda *items: cli.load_data(cli.argparse.Namespace(task="add", task_param=list(items), task_seed=0, corpus=None))
    for word in ("no", "false", "off", "0", "No", "FALSE"):
        assert t("n_digits=2", f"reverse_operands={word}").reverse_operands is False
    for word in ("yes", "true", "on", "1", "True"):
        assert t("n_digits=2", f"reverse_operands={word}").reverse_operands is True
    for bad, words in [(["reverse_operands=maybe"], ["reverse_operands", "true", "false"]),
                       (["reverse_operands=2"], ["reverse_operands"]),
                       (["n_digits=2.5"], ["n_digits", "integer"]),
                       (["n_digits=two"], ["n_digits", "integer"]),
                       (["ood_digits=3"], ["ood_digits"]),
                       (["n_digits=2", "n_digits=3"], ["n_digits", "twice"])]:
        with pytest.raises(UsageError) as e: t(*bad)
        for w in words: assert w in str(e.value), (bad, str(e.value))
    assert tuple(t("n_digits=2", "ood_digits=[3,4]").params["ood_digits"]) == (3, 4)


def test_task_param_bool_on_the_command_line(capsys, no_work):
    code, _, err = run(["phase1", *TASK, "--task-param", "reverse_operands=maybe", *TINY_TRAIN], capsys)
    _one_line_error(code, err)
    assert "reverse_operands" in err


@pytest.mark.parametrize("argv, words", [
    (["phase1", "--corpus", "text", "--files", "{tmp}/doc.txt", "--max-documents", "-1", *TINY_TRAIN], ["--max-documents", ">= 1"]),
    (["prepare", "--corpus", "text", "--files", "{tmp}/doc.txt", "--max-documents", "0"], ["--max-documents", ">= 1"]),
    (["phase1", *TASK, *TINY_TRAIN, "--n-models", "0"], ["--n-models", ">= 1"]),
    (["phase1", *TASK, *TINY_TRAIN, "--n-models", "3", "--model-seeds", "1,2"], ["--n-models", "--model-seeds"]),
    (["phase1", *TASK, *TINY_TRAIN, "--threshold", "5"], ["--threshold"]),
    (["phase2", *TASK, "--nonlinearities", "{p1}", *TINY_TRAIN, "--threshold", "0"], ["--threshold"]),
    (["transfer", "--source", "a={p1}", *TINY_TRAIN, "--threshold", "1.5"], ["--threshold"]),
    (["phase1", *TASK, *TINY_TRAIN, "--eval-examples", "100000000"], ["--eval-examples"]),
    (["phase1", *TASK, *TINY_TRAIN, "--eval-examples", "0"], ["--eval-examples"]),
    (["phase1", *TASK, *TINY_TRAIN, "--steps", "0"], ["--steps"]),
    (["demo", "--quick", "--steps", "0"], ["--steps"]),
    (["phase1", *TASK, *TINY_TRAIN, "--resume"], ["--resume", "--checkpoint-dir"]),
])
@pytest.mark.slow
def test_numbers_out_of_range_are_errors(argv, words, phase1_dir, tmp_path, no_work, capsys):
    (tmp_path / "doc.txt").write_text("a small document\n")
    argv = [str(a).replace("{tmp}", str(tmp_path)).replace("{p1}", str(phase1_dir)) for a in argv]
    code, _, err = run(argv + ["--out", tmp_path / "out"], capsys)
    assert code == 2, err
    assert "Traceback" not in err
    for w in words: assert w in err, err


def test_transfer_sources_are_not_silently_dropped(phase1_dir, tmp_path, no_work, capsys):
    code, _, err = run(["transfer", "--source", f"standard={phase1_dir}", *TINY_TRAIN, "--out", tmp_path / "o"], capsys)
    _one_line_error(code, err)
    assert "standard" in err and "reserved" in err
    code, _, err = run(["transfer", "--source", f"a={phase1_dir}", "--source", f"a={phase1_dir / 'best.safetensors'}", *TINY_TRAIN,
                        "--out", tmp_path / "o"], capsys)
    _one_line_error(code, err)
    assert "'a'" in err and "twice" in err
    code, _, err = run(["transfer", "--source", f"={phase1_dir}", *TINY_TRAIN, "--out", tmp_path / "o"], capsys)
    _one_line_error(code, err)


def test_resume_from_nothing_says_so(tmp_path, capsys):
    ck = tmp_path / "ck"; ck.mkdir()
    code, out, err = run(["phase1", *TASK, *TINY_MODEL, *TINY_TRAIN, "--n-models", "2", "--checkpoint-dir", ck, "--resume",
                          "--out", tmp_path / "p1"], capsys)
    assert code == 0, err
    assert "no checkpoint" in err and ("fresh" in err or "step 0" in err)


@pytest.mark.parametrize("cmd", ["phase2", "transfer"])
def test_resume_reaches_the_library(cmd, phase1_dir, tmp_path, monkeypatch, capsys):
    "--resume is passed to phase2/baseline and to the runner's run_transfer (its cells continue from their checkpoints)."
    seen = {}
    def stub(*a, **k): seen.update(k); raise KeyboardInterrupt
    monkeypatch.setattr(cli, "phase2" if cmd == "phase2" else "run_transfer", stub)
    argv = _command(cmd, "--out", tmp_path / "o", tmp_path, phase1_dir) + ["--checkpoint-dir", tmp_path / "ck", "--resume"]
    code, _, err = run(argv, capsys)
    assert code == 130, err
    assert seen.get("resume") is True


def _phase1_copy(phase1_dir, tmp_path, info):
    import shutil
    d = tmp_path / "p1copy"; shutil.copytree(phase1_dir, d)
    (d / "phase1.json").write_text(info if isinstance(info, str) else json.dumps(info))
    return d


@pytest.mark.parametrize("what", ["list", "missing best_step", "deep"])
def test_malformed_phase1_json_is_one_line(what, phase1_dir, tmp_path, no_work, capsys):
    info = json.loads((phase1_dir / "phase1.json").read_text())
    bad = {"list": [1, 2], "missing best_step": {k: v for k, v in info.items() if k != "best_step"},
           "deep": "[" * 100_000 + "]" * 100_000}[what]
    d = _phase1_copy(phase1_dir, tmp_path, bad)
    for argv in (["phase2", *TASK, "--nonlinearities", d], ["transfer", "--source", f"a={d}"]):
        code, _, err = run([*argv, *TINY_TRAIN, "--out", tmp_path / "o"], capsys)
        _one_line_error(code, err)
        assert "phase1.json" in err and str(d) in err
        if what == "missing best_step": assert "best_step" in err and "missing" in err


def test_deeply_nested_dataset_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "deep.json"; f.write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = run(["interpolate", f], capsys)
    _one_line_error(code, err)
    assert str(f) in err


# ---------------------------------------------------------------- issue 29 (N13): dataset values must be finite real numbers
_TOKS = '"inputs": [[[0.1, 0.2], [0.3, 0.4]], [[0.5, 0.6]]], "targets": [[[1.0, 1.0]], [[-1.0, 2.0]]]'


def _ragged(X=((0.1, 0.2), (0.3, 0.4), (0.5, 0.6)), X_lengths=(2, 1), Y=((1.0, 1.0), (-1.0, 2.0)), Y_lengths=(1, 1)):
    return dict(X=np.asarray(X), X_lengths=np.asarray(X_lengths), Y=np.asarray(Y), Y_lengths=np.asarray(Y_lengths))


@pytest.mark.parametrize("name, content, match", [
    ("huge_int.json", _TOKS.replace("0.5", "1" + "0" * 400), "too large"),
    ("overflow.json", _TOKS.replace("0.5", "1e400"), "finite"),
    ("nan.json", _TOKS.replace("0.5", "NaN"), "finite"),
    ("bool.json", _TOKS.replace("0.5", "true"), "true/false"),
    ("string.json", _TOKS.replace("0.5", '"0.5"'), "not a number"),
    ("complex.npz", _ragged(X=np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6 + 1j]])), "complex"),
    ("bool_tokens.npz", _ragged(X=np.array([[True, False], [False, True], [True, True]])), "bool"),
    ("strings.npz", _ragged(Y=np.array([["1.0", "1.0"], ["-1.0", "2.0"]])), "numbers"),
    ("inf.npz", _ragged(X=np.array([[0.1, 0.2], [0.3, np.inf], [0.5, 0.6]])), "finite"),
    ("float128_overflow.npz", _ragged(X=np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], dtype=np.longdouble) * np.longdouble("1e400")
                                       if np.finfo(np.longdouble).max > 1e400 else np.array([[0.1, 0.2], [0.3, np.inf], [0.5, 0.6]])), "finite"),
    ("fractional_lengths.npz", _ragged(X_lengths=np.array([2.7, 1.2])), "X_lengths"),
    ("bool_lengths.npz", _ragged(Y_lengths=np.array([True, True])), "Y_lengths"),
    ("negative_lengths.npz", _ragged(X_lengths=np.array([4, -1])), "X_lengths"),
    ("lengths_2d.npz", _ragged(X_lengths=np.array([[2, 1]])), "X_lengths"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 40 else "")
@pytest.mark.slow
def test_interpolate_refuses_values_that_are_not_finite_reals(name, content, match, tmp_path, monkeypatch, capsys):
    import spline_transformers.interpolation as interp
    monkeypatch.setattr(interp, "build_interpolator", lambda *a, **k: pytest.fail("built from a file that should be refused"))
    f = tmp_path / name
    if isinstance(content, str): f.write_text("{" + content + "}")
    else: np.savez(f, **content)
    code, _, err = run(["interpolate", f], capsys)
    _one_line_error(code, err)
    assert match in err and str(f) in err, err


def test_interpolate_reads_integral_float_lengths_and_integer_tokens(tmp_path, capsys):
    f = tmp_path / "ok.npz"; np.savez(f, **_ragged(X=np.array([[1, 2], [3, 4], [5, 6]]), X_lengths=np.array([2.0, 1.0])))
    g = tmp_path / "ok.json"; g.write_text("{" + _TOKS.replace("0.5", "5") + "}")
    for path in (f, g):
        code, out, err = run(["interpolate", path], capsys)
        assert code == 0 and "2 sequences, d = 2, 3 input tokens" in out, err


def test_interpolate_refuses_a_dataset_beyond_the_available_memory(tmp_path, monkeypatch, capsys):
    "Issue 29 (N5): 3,000 sequences (13,392 tokens, d = 20) grew to 22 GB in a minute with no output."
    import spline_transformers.interpolation as interp
    f = save_dataset_file(tmp_path / "big.npz", *random_dataset(N=3000, d=20, seed=0))
    monkeypatch.setattr(interp, "available_memory", lambda: 100 * 2**20)
    monkeypatch.setattr(interp, "_Builder", lambda *a, **k: pytest.fail("started building"))
    code, out, err = run(["interpolate", f], capsys)
    _one_line_error(code, err)
    assert "needs about 0.38 GB of memory" in err and "only 0.10 GB is available" in err and "13392 tokens" in err and out == "", err


def test_interpolate_shows_progress_on_stderr(tmp_path, capsys):
    f = save_dataset_file(tmp_path / "toy.json", *toy_dataset())
    code, out, err = run(["interpolate", f, "--json"], capsys)
    assert code == 0 and json.loads(out)["n_blocks"] == 15
    assert "interpolate: hardmax construction, stage place" in err and "interpolate: verifying 3 sequences" in err, err


def test_non_utf8_text_corpus_is_one_line(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "good.txt").write_text("hello world\n" * 20)
    bad = tmp_path / "docs" / "latin1.txt"; bad.write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1") * 20)
    code, _, err = run(["prepare", "--corpus", "text", "--files", tmp_path / "docs", "--out", tmp_path / "c", "--no-progress"], capsys)
    _one_line_error(code, err)
    assert "latin1.txt" in err and ("UTF-8" in err or "utf-8" in err)


@pytest.mark.parametrize("exc", [lambda: __import__("spline_transformers.corpora", fromlist=["x"]).HubUnavailableError(
                                     "corpus 'tinystories' needs the Hugging Face hub dataset, which could not be loaded here"),
                                 lambda: PermissionError(13, "Permission denied", "/some/where"),
                                 lambda: IsADirectoryError(21, "Is a directory", "/some/dir"),
                                 lambda: RecursionError("maximum recursion depth exceeded while decoding a JSON array")])
def test_foreseeable_errors_are_one_line(exc, monkeypatch, tmp_path, capsys):
    def boom(*a, **k): raise exc()
    monkeypatch.setattr(cli, "load_corpus", boom)
    code, _, err = run(["phase1", "--corpus", "tinystories", *TINY_TRAIN, "--out", tmp_path / "o"], capsys)
    _one_line_error(code, err)


def test_help_prints_each_default_once(capsys):
    for cmd in ("demo", "phase1", "phase2", "transfer", "interpolate", "prepare", "reproduce"):
        code, out, _ = run([cmd, "--help"], capsys)
        assert code == 0
        flat = " ".join(out.split())
        assert "%%" not in flat, cmd
        assert not re.search(r"\(default[ :][^()]*\)\s*\(default", flat), (cmd, re.search(r"\(default[ :][^()]*\)\s*\(default", flat))
    code, out, _ = run(["demo", "--help"], capsys)
    assert "95%" in out


def test_interpolate_help_shows_a_shipped_example(capsys):
    code, out, _ = run(["interpolate", "--help"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    cmds = re.findall(r"spline-transformers interpolate (\S+\.json)", flat)
    assert len(cmds) >= 2, flat
    for c in cmds: assert Path(c).is_file(), c


@pytest.mark.parametrize("name, d", [("toy_2d.json", 2), ("random_d20.json", 20)])
def test_shipped_examples_build_and_verify_exactly(name, d, capsys):
    f = Path(cli.__file__).parent / "examples" / name
    assert f.is_file()
    code, out, err = run(["interpolate", f, "--json"], capsys)
    assert code == 0, err
    r = json.loads(out)
    assert r["d"] == d and r["n_blocks"] == r["expected_blocks"] and r["worst_hausdorff"] < 1e-9


def test_progress_defaults_to_the_terminal(monkeypatch, tmp_path, capsys):
    seen = []
    def stub(data, arch, cfg, p1, **k): seen.append(cfg); raise KeyboardInterrupt
    monkeypatch.setattr(cli, "phase1", stub)
    argv = ["phase1", *TASK, "--steps", "4", "--device", "cpu", "--out", tmp_path / "o"]
    for tty in (True, False):
        monkeypatch.setattr(cli, "_is_terminal", lambda stream=None, tty=tty: tty)
        assert run(argv, capsys)[0] == 130
        assert seen[-1].progress is tty
    assert run(argv + ["--progress"], capsys)[0] == 130 and seen[-1].progress is True


def test_report_saves_concurrently(tmp_path):
    from spline_transformers.report import Report
    path = tmp_path / "r.html"
    pages = [Report(f"page {i}").text(f"{i} " * 200_000) for i in range(6)]
    texts = {p.to_html().split("<hr>")[0] for p in pages}
    errors = []
    def save(p):
        try:
            for _ in range(15): p.save(path)
        except Exception as e: errors.append(repr(e))
    ts = [threading.Thread(target=save, args=(p,)) for p in pages]
    for t in ts: t.start()
    for t in ts: t.join()
    assert errors == []
    assert path.read_text().split("<hr>")[0] in texts
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def test_offline_hub_corpus_is_one_line(tmp_path, capsys):
    "conftest keeps the Hugging Face hub offline: a hub corpus is a one-line error that names the offline alternatives."
    code, _, err = run(["prepare", "--corpus", "tinystories", "--out", tmp_path / "ts", "--no-progress"], capsys)
    _one_line_error(code, err)
    assert "tinystories" in err and "offline" in err
