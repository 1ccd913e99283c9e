"The experiment system: registry, statistics, the committed results (current, complete, with provenance), the zoo, and `reproduce` (smoke runs, kill and resume, CLI)."
import json, math, os, re, signal, subprocess, sys, time
from dataclasses import replace
from pathlib import Path

from conftest import build_docs

import numpy as np
import pandas as pd
import pytest
import torch

from spline_transformers import results as ex
from spline_transformers.experiments import EXPERIMENTS, SIZES, Arm, Experiment, Phase1Run, cells, register
from spline_transformers.stats import VERDICTS, Verdict, decide, paired_bootstrap
from spline_transformers.runner import CELL_COPIES, CELL_SCRATCH, _pending, cell_problem, reproduce, runs_in_progress
from spline_transformers.results import load_learned, learned_zoo, stale_results, zoo_dir
from spline_transformers.model import Nonlinearities

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PROVENANCE_KEYS = {"package_version", "git_commit", "git_dirty", "config_hash", "torch_version", "cpu", "threads_per_cell", "jobs",
                   "cell_wall_s", "date", "command"}


# ---------------------------------------------------------------- the registry
def test_at_least_eight_experiments_with_three_sizes_and_a_rule():
    assert len(EXPERIMENTS) >= 8
    for e in EXPERIMENTS.values():
        assert set(e.sizes) == set(SIZES), e.name
        assert e.claim and e.paper and e.verdicts, e.name
        for v in e.verdicts: assert v.rule.startswith("reproduced if"), (e.name, v.rule)
        for size in SIZES: assert len(cells(e, size)) >= 1


def test_phase1_and_phase2_seeds_never_overlap():
    for e in EXPERIMENTS.values():
        for size in SIZES:
            s = e.setting(size)
            p1 = {x for r in s.phase1_runs for x in r.seeds}
            assert not p1 & set(s.seeds), (e.name, size)
    add = EXPERIMENTS["add"]
    bad = replace(add, name="overlapping", sizes={**add.sizes, "cpu": replace(add.sizes["cpu"], seeds=(0, 100))})
    with pytest.raises(ValueError, match="also Phase I seeds"): register(bad)
    assert "overlapping" not in EXPERIMENTS


def test_a_verdict_must_name_arms_the_setting_has():
    add = EXPERIMENTS["add"]
    with pytest.raises(ValueError, match="arms are"): register(replace(add, name="badverdict", verdicts=(Verdict("nonexistent"),)))


def test_a_peer_arm_names_the_shipped_file_and_refuses_what_does_not_fit(tmp_path):
    from spline_transformers.model import PEER_ZOO
    from spline_transformers.experiments import Cell
    from spline_transformers.core import content_hash
    from spline_transformers.runner import run_cell
    afs = EXPERIMENTS["afs_shakespeare_char"]
    peer = [c for c in cells(afs, "smoke") if "peer" in (c.spec.get("nonlinearities") or "")]
    assert {(c.spec["nonlinearities"]["peer"], c.spec["nonlinearities"]["sha256"]) for c in peer} == \
        {(f"lm-afs/{n}", PEER_ZOO["lm-afs"][n][1]) for n in ("fineweb-mlp", "fineweb-mlp-attn")}   # the hash covers the file's content
    with pytest.raises(ValueError, match="lm-afs splines"): Arm("x", "peer:lm-afs/fineweb-nothing")
    with pytest.raises(ValueError, match="namespace"): Arm("x", "peer:elsewhere/fineweb-mlp")
    # the book's old grid (41 knots on ±6) cannot hold the authors' 64 knots on ±15: refused when the cells are made
    s = afs.sizes["cpu"]
    narrow = replace(afs, name="afs_narrow", sizes={**afs.sizes, "cpu": replace(s, arch=replace(s.arch, n_knots=41, spline_range=6.0))})
    with pytest.raises(ValueError, match="cannot use lm-afs/fineweb-mlp: .*n_knots"): cells(narrow, "cpu")
    # a cell made for other splines than the package ships under that name is refused before it loads its corpus
    spec = {**peer[0].spec, "nonlinearities": {**peer[0].spec["nonlinearities"], "sha256": "0" * 64}}
    with pytest.raises(ValueError, match="other splines under this name than the cell was made for"):
        run_cell(Cell(content_hash(spec), spec, (), "afs/bad/seed0"), tmp_path)


def test_config_hash_follows_the_setting():
    add = EXPERIMENTS["add"]
    changed = replace(add, sizes={**add.sizes, "cpu": replace(add.sizes["cpu"], threshold=0.99)})
    assert changed.config_hash("cpu") != add.config_hash("cpu")
    assert changed.config_hash("smoke") == add.config_hash("smoke")
    # a transfer matrix's hash depends on its targets' settings
    t = EXPERIMENTS["transfer"]
    before = t.config_hash("cpu")
    EXPERIMENTS["add"] = changed
    try: assert t.config_hash("cpu") != before
    finally: EXPERIMENTS["add"] = add


def test_shared_cells_are_trained_once():
    "The transfer matrix's standard row is the target experiments' standard arm for the same seeds."
    keys = {c.key for c in cells(EXPERIMENTS["add"], "cpu")}
    tcells = [c for c in cells(EXPERIMENTS["transfer"], "cpu") if c.label.startswith("transfer/standard->add/")]
    assert tcells and all(c.key in keys for c in tcells)


def test_an_arm_form_enters_the_hash_only_when_set():
    "Arms without a form hash as before the field existed; a form arm trains new cells, its plain-spline sibling shares the source's."
    assert "form" not in Arm("a", "phase1:x").to_dict() and Arm("a", "phase1:x", form="symmetrise").to_dict()["form"] == "symmetrise"
    deploy = {c.label.split("/")[1] + c.label[-1]: c for c in cells(EXPERIMENTS["lm_deploy"], "cpu") if c.spec["kind"] == "train"}
    char = {c.label.split("/")[1] + c.label[-1]: c for c in cells(EXPERIMENTS["lm_shakespeare_char"], "cpu") if c.spec["kind"] == "train"}
    assert deploy["spline0"].key == char["spline0"].key and deploy["gelu0"].key == char["gelu0"].key
    assert deploy["polynomial0"].spec["nonlinearities"] == {**char["spline0"].spec["nonlinearities"], "form": "polynomial:24"}
    assert len({deploy[f"{a}0"].key for a in ("spline", "polynomial", "smoothed", "symmetrised")}) == 4


def test_a_form_needs_phase1_splines():
    add = EXPERIMENTS["add"]
    bad = replace(add, name="formless", sizes={**add.sizes, "cpu": replace(add.sizes["cpu"], arms=add.sizes["cpu"].arms + (Arm("poly", form="polynomial:24"),))})
    with pytest.raises(ValueError, match="no Phase I splines"): cells(bad, "cpu")


def test_a_transfer_matrix_can_take_rows_from_outside_its_columns():
    "The language-model matrix: character-level splines as a row, BPE corpora as the columns; its standard row and diagonal are shared cells."
    t = EXPERIMENTS["lm_transfer"]
    labels = [c.label for c in cells(t, "cpu") if c.spec["kind"] == "train"]
    assert any("lm_shakespeare_char->lm_code_bpe" in l for l in labels) and not any(l.split("/")[1].endswith("->lm_shakespeare_char") for l in labels)
    assert len(labels) == len(t.targets) * (1 + len(t.rows)) * len(t.setting("cpu").seeds)
    own = {c.key for n in t.targets for c in cells(EXPERIMENTS[n], "cpu")}
    shared = [c for c in cells(t, "cpu") if c.spec["kind"] == "train" and c.key in own]
    assert len(shared) == len(t.targets) * 2 * len(t.setting("cpu").seeds)   # standard row and diagonal


# ---------------------------------------------------------------- statistics
def test_paired_bootstrap_is_reproducible_and_paired():
    ref, arm = [400, 500, 450, 700, 600], [200, 260, 240, 330, 300]
    a, b = paired_bootstrap(ref, arm), paired_bootstrap(ref, arm)
    assert a == b and a[1] <= a[0] <= a[2] and a[1] > 1
    # no difference: the interval contains 1
    est, lo, hi = paired_bootstrap(ref, ref)
    assert est == 1 and lo <= 1 <= hi
    # accuracy difference
    est, lo, hi = paired_bootstrap([0.5, 0.6, 0.55], [0.7, 0.8, 0.75], "final_test")
    assert math.isclose(est, 0.2) and lo > 0


def test_decide_says_one_of_four_verdicts():
    seeds = pd.DataFrame({"arm": ["standard"] * 6 + ["fast"] * 6 + ["slow"] * 6 + ["same"] * 6 + ["noisy"] * 6, "seed": list(range(6)) * 5,
                          "steps": [400, 420, 500, 450, 480, 430] + [200, 210, 250, 220, 240, 215] + [800, 840, 1000, 900, 960, 860]
                                   + [404, 420, 500, 450, 480, 434] + [200, 800, 300, 900, 480, 430],
                          "reached": True, "final_test": 0.9, "final_ood": np.nan})
    seeds["restricted"] = seeds.steps
    assert decide(Verdict("fast"), seeds)["verdict"] == "reproduced"
    assert decide(Verdict("slow"), seeds)["verdict"] == "reversed"
    assert decide(Verdict("same"), seeds)["verdict"] == "no effect"
    assert decide(Verdict("noisy"), seeds)["verdict"] == "underpowered"
    assert "ties" in decide(Verdict("same", statistic="final_test", above=0.0), seeds)["why"]   # every seed at 0.9 in both arms
    censored = seeds.assign(reached=lambda d: d.arm.isin(["fast"]) & (d.seed < 2))
    assert "censored" in decide(Verdict("fast"), censored)["why"]
    with pytest.raises(ValueError, match="arms"): decide(Verdict("missing"), seeds)


@pytest.mark.slow
def test_changing_one_line_of_the_statistic_makes_every_result_stale(tmp_path):
    "The config hash covers the statistic's source: a copy of the package with one line of `decide` edited finds every committed result stale."
    import shutil, subprocess, sys
    import spline_transformers
    pkg = Path(spline_transformers.__file__).parent
    shutil.copytree(pkg, tmp_path / "spline_transformers", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    stats = tmp_path / "spline_transformers" / "stats.py"
    src = stats.read_text(); line = '    if lo > v.above: return {**out, "verdict": "reproduced", "why": f"the interval lies above {v.above:g}"}'
    assert line in src
    stats.write_text(src.replace(line, line.replace("lo > v.above", "lo >= v.above")))
    code = "from spline_transformers.results import stale_results; import sys; print(len(stale_results(sys.argv[1])))"
    count = lambda path: int(subprocess.run([sys.executable, "-c", code, str(RESULTS)], env={**os.environ, "PYTHONPATH": str(path)}, cwd=path,
                                            capture_output=True, text=True, check=True).stdout.split()[-1])   # cwd: `-c` puts it first on sys.path
    assert count(tmp_path) == len(committed())   # every registered experiment's result is stale
    assert count(pkg.parent) == 0


def test_every_committed_result_was_decided_after_its_registration():
    from spline_transformers.experiments import registration
    from spline_transformers.core import git_output
    for n in committed():
        reg = registration(n, RESULTS)
        assert reg is not None, f"{n}: no registration of its configuration in results/registrations.json"
        p = json.loads((RESULTS / n / "provenance.json").read_text())
        decided = p.get("decided", p)["git_commit"]
        if git_output("cat-file", "-t", reg["commit"]) == "commit" and git_output("cat-file", "-t", decided or "") == "commit":
            base = git_output("merge-base", reg["commit"], decided)
            assert base == reg["commit"], f"{n}: decided at {decided[:10]}, which is not at or after its registration {reg['commit'][:10]}"


# ---------------------------------------------------------------- the committed results
def committed():
    "The committed results of the registered experiments (chapter 21's sweeps, runner kinds, are tested in test_interpolation.py)."
    return sorted(p.parent.name for p in RESULTS.glob("*/summary.json") if "module" not in json.loads(p.read_text()))


def test_committed_results_are_current():
    problems = stale_results(RESULTS)
    assert not problems, "\n".join(problems)


def test_every_experiment_has_a_committed_cpu_result_with_provenance():
    "Every registered experiment has its cpu result, or is a run in progress: some of its cells committed (chapter 9c), no verdict yet."
    have = committed()
    labels = [json.loads((RESULTS / ".cells" / k / "done.json").read_text())["label"] for k, fs in _committed_cells().items() if "done.json" in fs]
    running = {n for n in EXPERIMENTS if any(l.startswith(f"{n}/") for l in labels)}   # committed cells of its own run (not a local run's, nor shared)
    missing = [n for n in EXPERIMENTS if n not in have and n not in running]
    assert not missing, (f"no committed cpu result for {missing}: run `spline-transformers reproduce {' '.join(missing)} --size cpu --jobs 2 --out results`, "
                         "or commit its done cells with tools/commit_cells.py")
    for n in have:
        s = json.loads((RESULTS / n / "summary.json").read_text())
        p = json.loads((RESULTS / n / "provenance.json").read_text())
        assert s["size"] == "cpu" and s["verdict"] in VERDICTS, n
        assert PROVENANCE_KEYS <= set(p), (n, PROVENANCE_KEYS - set(p))
        assert p["config_hash"] == s["config_hash"] == EXPERIMENTS[n].config_hash("cpu")
        assert (RESULTS / n / "metrics.csv.gz").is_file()


def _committed_cells()->dict:
    "key -> the committed files of each cell folder under results/.cells (git's list: a local run's cells beside them are its own business)."
    try: git = subprocess.run(["git", "ls-files", "--", "results/.cells"], cwd=ROOT, capture_output=True, text=True)
    except OSError: git = None
    if git is None or git.returncode != 0:   # not a git checkout (an unpacked sdist): every cell on disk counts as committed
        return {p.name: [str(f.relative_to(p)) for f in p.rglob("*") if f.is_file()] for p in (RESULTS / ".cells").glob("*") if p.is_dir()}
    files = git.stdout.split()
    out = {}
    for f in files: out.setdefault(Path(f).parts[2], []).append(str(Path(*Path(f).parts[3:])))
    return out


def test_committed_cells_are_intact_and_belong_to_a_run_in_progress():
    "A run longer than a session commits its done cells (tools/commit_cells.py): each is intact, holds no scratch, and is a current cpu cell of a run without a result yet."
    cells_here = _committed_cells()
    running = runs_in_progress(RESULTS)
    theirs = _pending(list(running), "cpu") if running else {}
    for key, files in cells_here.items():
        assert "done.json" in files, f"results/.cells/{key}: committed without done.json (only done cells are committed)"
        assert key in theirs, (f"results/.cells/{key}: a done cell of no run in progress: its result is written (`python tools/commit_cells.py NAME --drop`), "
                               f"or its configuration changed (`git rm -r --cached results/.cells/{key}`)")
        assert cell_problem(theirs[key], RESULTS / ".cells") is None, cell_problem(theirs[key], RESULTS / ".cells")
        assert not [f for f in files if Path(f).name in CELL_SCRATCH or Path(f).parts[0].startswith("ckpt") or f in CELL_COPIES], (key, files)   # results only
    size = sum((RESULTS / ".cells" / k / f).stat().st_size for k, fs in cells_here.items() for f in fs)
    assert size < 40 * 2**20, f"results/.cells holds {size / 2**20:.1f} MB of committed cells; commit a run's result and --drop its cells"


def test_committed_verdicts_follow_from_the_committed_tables():
    "The verdict in summary.json is what the rule gives on the committed per-seed table (nobody edited it by hand)."
    for n in committed():
        s = json.loads((RESULTS / n / "summary.json").read_text())
        if EXPERIMENTS[n].targets: continue
        seeds = pd.DataFrame(s["per_seed"]).fillna({"steps": math.inf})
        for v, got in zip(EXPERIMENTS[n].verdicts, s["verdicts"]):
            want = decide(v, seeds)
            assert want["verdict"] == got["verdict"], (n, v)
            assert math.isclose(want["estimate"], got["estimate"] if got["estimate"] is not None else math.inf, rel_tol=1e-9), (n, v)


def test_results_stay_small():
    size = sum(f.stat().st_size for f in RESULTS.rglob("*") if f.is_file() and ".cells" not in f.parts)
    # 24 experiments, 5 pilots and 2 sweeps: 2.4 MB with the tables gzip-compressed (9.9 MB before; modadd_authors' 10,000-step
    # curves of 75 seeds are 0.45 MB of it)
    assert size < 10 * 2**20, f"results/ holds {size / 2**20:.1f} MB; keep it to a few MB (thin the logged curves before raising this)"
    assert not list(RESULTS.glob("*/*.csv")), "a result table is plain CSV: results hold gzip-compressed tables (experiments.write_table)"


# ---------------------------------------------------------------- the zoo
def test_zoo_entries_are_the_committed_results():
    zoo = learned_zoo()
    assert len(zoo) >= 1, "the package ships no learned nonlinearities: run experiments.update_zoo('results')"
    for r in zoo.itertuples():
        src = RESULTS / r.experiment / "splines" / f"{r.run}.safetensors"
        assert src.read_bytes() == (zoo_dir() / f"{r.name}.safetensors").read_bytes(), r.name
        assert r.config_hash == EXPERIMENTS[r.experiment].config_hash(r.size), f"zoo entry {r.name} is stale"
        nl = load_learned(r.name)
        assert isinstance(nl, Nonlinearities) and nl.frozen and len(nl.mlp) + len(nl.attn) >= 1


def test_load_learned_refuses_unknown_names():
    if not len(learned_zoo()): pytest.skip("no zoo shipped")
    with pytest.raises(ValueError, match="valid values"): load_learned("not-a-zoo-entry")


@pytest.fixture
def zoo_copy(tmp_path, monkeypatch):
    "A copy of the shipped zoo that `learned_zoo` and `load_learned` read instead (the committed zoo is never touched)."
    z = tmp_path / "zoo"
    import shutil; shutil.copytree(zoo_dir(), z)
    import spline_transformers.model as model   # `load_peer` lives in chapter 3 and reads its own `zoo_dir`
    for m in (ex, model): monkeypatch.setattr(m, "zoo_dir", lambda: z)
    return z


@pytest.mark.parametrize("text, words", [('{"add": {"experiment": "ad', ["zoo.json", "not valid JSON"]),
                                         ('["add"]', ["zoo.json", "list", "object"]),
                                         ('{"add": 3}', ["zoo.json", "'add'", "object"])])
def test_zoo_index_of_the_wrong_shape_names_the_file(zoo_copy, text, words):
    "Issue 29 N14: a truncated zoo.json, a list, or an entry that is not an object: one-line errors naming zoo.json."
    (zoo_copy / "zoo.json").write_text(text)
    for f in (learned_zoo, lambda: load_learned("add")):
        with pytest.raises(ValueError) as e: f()
        msg = str(e.value)
        assert "\n" not in msg and all(w in msg for w in words), msg


def test_zoo_file_swapped_for_another_entry_is_refused(zoo_copy):
    "Issue 29 N14: add-m1's file copied over add's (same config, other splines) fails the checksum recorded in the zoo entry."
    assert load_learned("add") is not None
    (zoo_copy / "add.safetensors").write_bytes((zoo_copy / "add-m1.safetensors").read_bytes())
    with pytest.raises(ValueError, match=r"add\.safetensors.*zoo\.json") as e: load_learned("add")
    assert "\n" not in str(e.value)
    assert load_learned("add-m1") is not None   # the others still load


@pytest.mark.parametrize("key", ["../evil", "a/b", "..", "sub\\x"])
def test_zoo_names_stay_inside_the_zoo_folder(zoo_copy, key):
    "Issue 29 N14: a zoo.json key with a path separator or '..' is refused (it is never joined into a path), and so is such a name."
    index = json.loads((zoo_copy / "zoo.json").read_text())
    index[key] = index["add"]
    (zoo_copy / "zoo.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="zoo.json") as e: learned_zoo()
    assert repr(key) in str(e.value) or key in str(e.value)
    with pytest.raises(ValueError, match="not a plain file name"): load_learned(key)   # refused before any file is read


# ---------------------------------------------------------------- reproduce
@pytest.mark.slow
def test_every_experiment_runs_at_smoke_size(smoke_run):
    "`reproduce all --size smoke --jobs 2` through the command line (the session's one smoke run, `conftest.smoke_run`): every experiment writes its summary, tables and provenance."
    out, r = smoke_run
    assert r.args[3:-1] == ["reproduce", "all", "--size", "smoke", "--jobs", "2", "--out"]   # `out` is this test's copy of the run's folder
    assert r.returncode == 0, r.stderr[-3000:]
    for n in EXPERIMENTS:
        s = json.loads((out / n / "summary.json").read_text())
        assert s["size"] == "smoke" and s["config_hash"] == EXPERIMENTS[n].config_hash("smoke")
        assert PROVENANCE_KEYS <= set(json.loads((out / n / "provenance.json").read_text()))
        assert f"{n}: " in r.stdout
    assert "cells" in r.stderr and "left ~" in r.stderr   # progress lines with an ETA
    copy = pd.read_csv(out / "copy" / "by_size.csv.gz")
    assert {"length", "seq_acc", "split", "arm", "seed"} <= set(copy.columns)
    assert (out / "add" / "splines" / "mlp_r0.safetensors").is_file()
    for n, e in EXPERIMENTS.items():   # every language model's arms are probed: histograms per layer and a text sample
        if e.task != "corpus": continue
        probes = json.loads((out / n / "probes.json").read_text())
        assert set(probes) == {a.name for a in e.setting("smoke").arms}, n
        for p in probes.values():
            assert len(p["mlp"]) == len(p["attn"]) == e.setting("smoke").arch.n_layers and p["sample"] and p["seed"] == e.setting("smoke").seeds[0]
    # a second run finds everything done and trains nothing
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "spline_transformers.cli", "reproduce", "modadd", "--size", "smoke", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "0 to run" in r.stderr, r.stderr


@pytest.mark.slow
def test_a_killed_run_resumes(tmp_path):
    "Kill `reproduce` after its first cell; without --resume it refuses, with --resume it keeps the done cell and finishes."
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "spline_transformers.cli", "reproduce", "parentheses", "--size", "smoke", "--out", str(out)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    root = out / ".cells"
    deadline = time.time() + 300
    while time.time() < deadline and not list(root.glob("*/done.json")): time.sleep(0.2)
    done = list(root.glob("*/done.json"))
    assert done, "no cell finished in time"
    os.killpg(p.pid, signal.SIGKILL); p.wait()
    first = {f: f.stat().st_mtime_ns for f in done}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if not (out / "parentheses" / "summary.json").is_file():   # the kill left an unfinished cell
        assert r.returncode == 2 and "--resume" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        r = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert all(f.stat().st_mtime_ns == m for f, m in first.items()), "a done cell was run again"
    assert (out / "parentheses" / "summary.json").is_file()


def test_reproduce_refuses_bad_input_before_work(tmp_path, capsys):
    from spline_transformers.cli import main
    assert main(["reproduce", "nosuch", "--out", str(tmp_path)]) == 2
    assert "unknown experiment" in capsys.readouterr().err
    assert main(["reproduce", "--out", str(tmp_path)]) == 2
    assert "--list" in capsys.readouterr().err
    assert main(["reproduce", "add", "--size", "gpu", "--out", str(tmp_path)]) == 2
    assert "cuda" in capsys.readouterr().err
    assert not list(tmp_path.rglob("done.json"))


def test_reproduce_list_shows_every_experiment(capsys):
    from spline_transformers.cli import main
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for n in EXPERIMENTS: assert f"\n{n} " in "\n" + out or out.startswith(n), n
    assert "cells at cpu" in out
    assert re.search(r"registered [0-9a-f]{10} \(\d{4}-\d\d-\d\d\), decided\n", out)   # each experiment's status: decided, running (cells done so far) or not run


# ---------------------------------------------------------------- issue 27: the authors' splines in the zoo's lm-afs namespace
@pytest.mark.parametrize("name, counts, sharing", [("lm-afs/fineweb-mlp", (4, 0, 0), "per_layer"),
                                                   ("lm-afs/fineweb-mlp-attn-shared", (1, 0, 1), "shared"),
                                                   ("lm-afs/fineweb-mlp-attn", (4, 0, 4), "per_layer")])
def test_lm_afs_splines_load_by_name(name, counts, sharing, monkeypatch):
    nl = load_learned(name)
    assert (len(nl.mlp), len(nl.attn), len(nl.pre_qkv)) == counts and nl.sharing == sharing and nl.frozen
    assert name in set(ex.peer_zoo().name)
    monkeypatch.setenv("SPLINE_TRANSFORMERS_WIDGETS", "0")
    from spline_transformers.editor import SplineEditor   # the spline editor opens them and edits the values in place
    ed = SplineEditor(nl)
    assert len(ed.refs) == sum(counts)
    last = list(ed.refs)[-1]; ed.select(last)
    s = nl.pre_qkv[-1] if counts[2] else nl.mlp[-1]
    before = s.values.clone()
    ed.drag_knot(30, 5.0)
    assert s.values[30].item() == 5.0 and torch.equal(s.values[:30], before[:30])
    assert ed.undo() and torch.equal(s.values, before)


def test_lm_afs_names_stay_in_their_table_and_files_are_checked(zoo_copy):
    for bad in ["lm-afs/../add", "lm-afs/", "lm-afs/ptAf-optimizedMlp-layerSpecific-phase1-step20000.csv"]:
        with pytest.raises(ValueError, match="valid values"): load_learned(bad)
    with pytest.raises(ValueError, match="not a plain file name"): load_learned("lm-afsx/fineweb-mlp")
    f = zoo_copy / "lm-afs" / "ptAf-optimizedMlp-layerSpecific-phase1-step20000.csv"
    f.write_text(f.read_text().replace("0.01,", "0.02,", 1))
    with pytest.raises(ValueError, match="SHA-256") as e: load_learned("lm-afs/fineweb-mlp")
    assert "\n" not in str(e.value)
    f.unlink()
    with pytest.raises(FileNotFoundError, match="reinstall"): load_learned("lm-afs/fineweb-mlp")


def test_steps_figure_shows_every_seed():
    "Issue 28 (11): seeds that reached the threshold at the same step are drawn apart (as many positions as seeds), hover names the seed."
    r = ex.load_result("add")
    fig = ex.steps_figure(r)
    ps = pd.DataFrame(r["summary"]["per_seed"])
    pts = [(x, y) for t in fig.data for x, y in zip(t.x, t.y)]
    assert len(pts) == len(ps) and len(set(pts)) == len(ps), f"{len(set(pts))} distinct positions for {len(ps)} seeds"
    for arm, g in ps.groupby("arm"):
        seeds = sorted(int(c[0]) for t in fig.data if t.legendgroup == arm for c in t.customdata)
        assert seeds == sorted(g.seed.astype(int)), (arm, seeds)
    assert all("seed %{customdata[0]}" in t.hovertemplate for t in fig.data)
    # a tie is spread within its arm's row, and the rows stay in the registry's order
    ys = {t.legendgroup: [float(y) for y in t.y] for t in fig.data if not t.name.endswith("never")}
    for i, arm in enumerate(ex._arm_order(r)): assert all(abs(y - i) < 0.5 for y in ys[arm]), (arm, ys[arm])
    assert list(fig.layout.yaxis.ticktext) == ex._arm_order(r)
    assert ex._swarm([5, 5, 5, 9], tol=0.5, gap=0.1) == pytest.approx([-0.1, 0.0, 0.1, 0.0])


def test_findings_html_is_a_table_to_read():
    "Issue 28 (9): the findings table for a reader: whole claims, numbers in the paper's units, links to chapter pages, no index."
    import html, re
    from spline_transformers.report import findings_html, estimate_text, chapter_page
    assert estimate_text("speedup", 1.55, 1.33, 1.81) == "speed-up 1.55× [1.33×, 1.81×]"
    assert estimate_text("speedup", None, None, None) == "speed-up — [—, —]"
    assert estimate_text("final_test", -0.00703, -0.0812, 0.0672) == "−0.7 pp test accuracy [−8.1, +6.7]"
    assert estimate_text("final_ood", 0.0187, -0.00782, 0.0445) == "+1.9 pp OOD accuracy [−0.8, +4.5]"
    assert estimate_text("diagonal", 0.5, 0.5, 0.5) == "diagonal best in 50% of targets"
    with pytest.raises(ValueError, match="unknown statistic"): estimate_text("loss", 1, 0, 2)
    f = ex.findings_table()
    heads = {n: json.loads((ex.results_dir() / n / "summary.json").read_text())["verdicts"][0] for n in f.experiment
             if (ex.results_dir() / n / "summary.json").is_file()}   # a run in progress has no verdict yet: its row says how far it got
    t = findings_html(f, heads)
    text = html.unescape(re.sub(r"<[^>]+>", "", t))
    for n, e in EXPERIMENTS.items(): assert e.claim in text, n
    assert "..." not in text and "final_test" not in text
    assert re.findall(r'<a href="([^"]+)"', t) == [chapter_page(c) for c in f.chapter if c]
    assert all(build_docs.chapter(c).is_file() for c in f.chapter if c)
    assert t.count("<tr>") == len(f) + 1 and "<th></th>" not in t


def test_registering_the_same_experiment_again_changes_nothing_and_another_is_refused():
    "A chapter run after its module was imported registers the identical experiment again: a no-op; a changed one under the same name is refused."
    add = EXPERIMENTS["add"]
    assert register(add) is add and list(EXPERIMENTS).count("add") == 1
    changed = replace(add, claim=add.claim + " (changed)")
    with pytest.raises(ValueError, match="already registered, with another setting"): register(changed)
    assert EXPERIMENTS["add"] is add


def test_every_contrast_is_registered_current_and_decided():
    "Contrasts (claims across experiments) are in the ledger at their current rule; one read as registered before a result really was."
    from spline_transformers.experiments import CONTRASTS, registration
    from spline_transformers.results import contrast_result
    from spline_transformers.core import git_output
    assert len(CONTRASTS) >= 10
    for n, c in CONTRASTS.items():
        reg = registration(n, RESULTS)
        assert reg is not None, f"{n}: no registration of its rule in results/registrations.json; run `spline-transformers reproduce {n} --register`"
        r = contrast_result(n, RESULTS)
        assert r["verdict"] in VERDICTS, f"{n}: {r['verdict']} ({r['why']})"
        assert not r["stale"], (n, r["stale"])
        for e in {p[0] for p in c.parts} - set(r["post_hoc"]):   # read as registered before its result: the first commit holding this result descends from the registration
            path, cells = f"results/{e}/summary.json", json.loads((RESULTS / e / "summary.json").read_text())["cells_hash"]
            held = [h for h in git_output("log", "--format=%H", "--", f":/{path}").split()
                    if json.loads(git_output("show", f"{h}:{path}") or "{}").get("cells_hash") == cells]
            if held and git_output("cat-file", "-t", reg["commit"]) == "commit":
                assert git_output("merge-base", reg["commit"], held[-1]) == reg["commit"], f"{n}: {e}'s result was first committed at {held[-1][:10]}, before the contrast's registration"
