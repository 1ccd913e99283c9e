"""Results are data a person owns (issue 29): `reproduce` never replaces a result unasked, never leaves one half-written,
never trusts a damaged cell, and its cells die with it. Most tests run the registered `tiny` experiment
(`tiny_experiment.py`, five cells of seconds) once, then copy its folder and damage, kill or race it."""
import json, os, random, shutil, signal, subprocess, sys, time, warnings
from pathlib import Path

import pandas as pd
import pytest

from spline_transformers import runner as ex
from spline_transformers.cli import main
from spline_transformers.core import FolderLock
from spline_transformers.experiments import EXPERIMENTS, cells, write_table
from spline_transformers.runner import cell_problem, reproduce
from spline_transformers.results import load_result, findings_table, StaleResult

sys.path.insert(0, str(Path(__file__).parent))
from tiny_experiment import LONG_ENV, NAME, tiny  # noqa: E402,F401  (tiny: the fixture)

ROOT = Path(__file__).resolve().parents[1]
TINY = [sys.executable, str(Path(__file__).parent / "tiny_experiment.py")]   # the command line with `tiny` registered


@pytest.fixture(scope="module")
def done_run(tiny, tmp_path_factory):
    "A finished smoke run of `tiny`: its results folder, with `.cells`."
    out = tmp_path_factory.mktemp("tiny") / "out"
    reproduce(NAME, "smoke", jobs=2, out=out, log=None)
    return out


def _copy(src:Path, dst:Path)->Path:
    shutil.copytree(src, dst); return dst


def _one_line_error(capsys)->str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _snapshot(folder:Path)->dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _cell_processes(marker:str)->list:
    "PIDs of live processes whose command line mentions `marker` (our cells name their `.cells` folder)."
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid(): continue
        try: cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError: continue
        try: state = next(l for l in (d / "status").read_text().splitlines() if l.startswith("State:"))
        except (OSError, StopIteration): continue
        if marker in cmd and "cell_main" in cmd and "Z" not in state: pids.append(int(d.name))
    return pids


def _wait_gone(marker:str, seconds:float=15)->list:
    deadline = time.time() + seconds
    while time.time() < deadline and _cell_processes(marker): time.sleep(0.2)
    return _cell_processes(marker)


# ---------------------------------------------------------------- N1: never replace a result unasked
def test_smoke_run_refuses_to_replace_a_cpu_result(tmp_path, capsys):
    "N1: the committed ADD result in --out; `reproduce add --size smoke` refuses in one line and changes nothing."
    out = tmp_path / "results"; _copy(ROOT / "results" / "add", out / "add")
    before = _snapshot(out)
    assert main(["reproduce", "add", "--size", "smoke", "--out", str(out)]) == 2
    err = _one_line_error(capsys)
    assert "cpu-size result" in err and "--overwrite" in err
    assert _snapshot(out) == before and not (out / ".cells").exists()


def test_a_stale_user_result_is_refused(tmp_path, capsys):
    "N1: a user's own cpu result whose configuration is not the registry's is not replaced without --overwrite."
    out = tmp_path / "mine"; _copy(ROOT / "results" / "add", out / "add")
    s = json.loads((out / "add" / "summary.json").read_text()); s["config_hash"] = "0123456789abcdef"
    (out / "add" / "summary.json").write_text(json.dumps(s))
    before = _snapshot(out)
    assert main(["reproduce", "add", "--out", str(out)]) == 2
    assert "stale" in _one_line_error(capsys)
    assert _snapshot(out) == before


def test_a_folder_the_package_did_not_write_is_refused(tmp_path, capsys):
    "N1: an --out/NAME folder without a summary (a user's own folder) is never replaced unasked."
    out = tmp_path / "out"; (out / "add").mkdir(parents=True); (out / "add" / "thesis.tex").write_text("mine")
    assert main(["reproduce", "add", "--size", "smoke", "--out", str(out)]) == 2
    assert "no summary.json" in _one_line_error(capsys)
    assert (out / "add" / "thesis.tex").read_text() == "mine"


def test_a_current_result_is_kept_and_nothing_runs(tmp_path):
    "N1: the committed result is current: reproduce returns it, runs no cell and rewrites no file."
    out = tmp_path / "results"; _copy(ROOT / "results" / "add", out / "add")
    before = _snapshot(out / "add"); lines = []
    res = reproduce("add", "cpu", out=out, log=lines.append)
    assert res["add"]["config_hash"] == EXPERIMENTS["add"].config_hash("cpu")
    assert any("kept" in l for l in lines) and any("0 to run" in l for l in lines)
    assert _snapshot(out / "add") == before and not [p for p in (out / ".cells").iterdir() if p.is_dir()]


def test_the_cli_sends_other_sizes_away_from_results(monkeypatch):
    "N1: --out defaults to results/ for the cpu size only; smoke and gpu go to runs/SIZE/."
    seen = {}
    monkeypatch.setattr("spline_transformers.cli.reproduce", lambda names, size, jobs, out, *a, **k: seen.setdefault(size, out) and {})
    assert main(["reproduce", "add", "--size", "smoke"]) == 0 and seen["smoke"] == "runs/smoke"
    assert main(["reproduce", "add"]) == 0 and seen["cpu"] == "results"
    assert main(["reproduce", "add", "--size", "gpu", "--device", "cpu"]) == 0 and seen["gpu"] == "runs/gpu"


def test_overwrite_replaces_a_result_of_another_size(done_run, tmp_path):
    "N1: with overwrite=True a smoke run may replace a cpu result: the folder then holds the smoke result, whole."
    out = _copy(done_run, tmp_path / "o")
    s = json.loads((out / NAME / "summary.json").read_text()); s["size"] = "cpu"; (out / NAME / "summary.json").write_text(json.dumps(s))
    with pytest.raises(ValueError, match="cpu-size result"): reproduce(NAME, "smoke", out=out, log=None)
    reproduce(NAME, "smoke", out=out, log=None, overwrite=True)
    assert json.loads((out / NAME / "summary.json").read_text())["size"] == "smoke"
    assert json.loads((out / NAME / "provenance.json").read_text())["size"] == "smoke"


# ---------------------------------------------------------------- N3: a result folder is complete or absent
def _consistent(folder:Path, versions:dict)->str:
    "Which complete version `folder` is ('absent' if it is not there); fails if it mixes files of two versions."
    if not folder.exists(): return "absent"
    snap = _snapshot(folder)
    prov = json.loads(snap.pop(Path("provenance.json"), b"{}") or b"{}")   # differs run to run (date, command)
    for name, want in versions.items():
        if snap == want:
            assert prov.get("size") == json.loads(snap[Path("summary.json")])["size"], f"{folder}: provenance of another run"
            return name
    raise AssertionError(f"{folder} is half-written: {sorted(map(str, snap))}")


@pytest.mark.slow
def test_a_killed_summary_leaves_the_old_result_or_the_new(done_run, tmp_path):
    "N3: SIGKILL `reproduce --overwrite` at random moments while it replaces a cpu result: the folder is always one result, whole."
    out = _copy(done_run, tmp_path / "k")
    s = json.loads((out / NAME / "summary.json").read_text()); s["size"] = "cpu"; s["verdict"] = "old"
    (out / NAME / "summary.json").write_text(json.dumps(s, indent=2))
    (out / NAME / "provenance.json").write_text(json.dumps({"size": "cpu"}))
    write_table(pd.DataFrame(columns=["step", "model", "seed", "split", "metric", "value"]), out / NAME / "metrics.csv.gz")   # an unmistakably different old result
    old_dir = _copy(out / NAME, tmp_path / "k_old")
    strip = lambda f: {k: v for k, v in _snapshot(f).items() if k.name != "provenance.json"}
    old, new = strip(old_dir), strip(done_run / NAME)
    cmd = TINY + ["reproduce", NAME, "--size", "smoke", "--out", str(out), "--overwrite"]
    t0 = time.perf_counter(); r = subprocess.run(cmd, capture_output=True, text=True, timeout=300); full = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr
    assert _consistent(out / NAME, {"new": new}) == "new"   # the same cells give the same result
    # Kill times home in on the moment the new result replaces the old, where a half-written folder would show: a kill that
    # finds the old result moves the window's start to its time, one that finds the new moves the end (on a busy machine a
    # run is slower or faster than the timed one, so a window that holds only one outcome widens on that side).
    rng, seen, n, lo, hi = random.Random(29), [], 8, 0.4 * full, 1.2 * full
    for trial in range(n):   # back to the old result, then a run killed at a random moment of the window
        shutil.rmtree(out / NAME); _copy(old_dir, out / NAME)
        wait = lo + (hi - lo) * rng.uniform(0.25, 0.75)
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(wait)
        p.send_signal(signal.SIGKILL); p.wait()
        seen.append(_consistent(out / NAME, {"old": old, "new": new}))
        if seen[-1] == "old": lo, hi = wait, (hi if "new" in seen else max(hi, 1.5 * wait))
        elif seen[-1] == "new": hi, lo = wait, (lo if "old" in seen else min(lo, wait / 1.5))
    assert "absent" not in seen, seen   # Linux swaps the folders in one step
    assert {"old", "new"} <= set(seen), f"the kill times missed the summary: {seen}"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and _consistent(out / NAME, {"new": new}) == "new"
    assert not [q for q in out.iterdir() if ".tmp-" in q.name], "staged folders of killed runs were left behind"


# ---------------------------------------------------------------- N4: a damaged cell is refused and run again
def _train_cell(exp, size="smoke"):
    return next(c for c in cells(exp, size) if c.spec["kind"] == "train")


def test_cell_problem_finds_every_kind_of_damage(tiny, done_run, tmp_path):
    "N4, N12: halved, NaN, edited, empty or binary metrics and a corrupt done.json are each named, with the file."
    c = _train_cell(tiny)
    def damaged(edit):
        out = tmp_path / f"d{random.random()}"; shutil.copytree(done_run / ".cells" / c.key, out / c.key)
        edit(out / c.key); return cell_problem(c, out)
    assert cell_problem(c, done_run / ".cells") is None
    lines = (done_run / ".cells" / c.key / "metrics.csv").read_text().splitlines()
    halve = lambda f: (f / "metrics.csv").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    nan = lambda f: (f / "metrics.csv").write_text("\n".join(lines[:-1] + [",".join(lines[-1].split(",")[:-1] + ["nan"])]) + "\n")
    edit = lambda f: (f / "metrics.csv").write_text((f / "metrics.csv").read_text().replace("0.", "0.9", 1))
    for fn, words in ((halve, "checksum"), (nan, "checksum"), (edit, "checksum"),
                      (lambda f: (f / "metrics.csv").write_text(""), "checksum"),
                      (lambda f: (f / "metrics.csv").write_bytes(b"\x00\xff\x00garbage"), "checksum"),
                      (lambda f: (f / "done.json").write_text('{"key": '), "done.json")):
        msg = damaged(fn)
        assert msg and words in msg and c.key in msg, msg
    # cells written before checksums existed: the content itself is checked
    def no_checksum(f):
        d = json.loads((f / "done.json").read_text()); d.pop("sha256"); (f / "done.json").write_text(json.dumps(d))
    for fn, words in ((halve, "step"), (nan, "not finite"), (lambda f: (f / "metrics.csv").write_text(""), "CSV"),
                      (lambda f: (f / "metrics.csv").write_bytes(b"\x00\xff\x00garbage"), "metrics.csv")):
        msg = damaged(lambda f: (no_checksum(f), fn(f)))
        assert msg and words in msg and "metrics.csv" in msg, msg
    assert damaged(no_checksum) is None


@pytest.mark.slow
def test_a_damaged_cell_is_run_again_under_resume(tiny, done_run, tmp_path, capsys):
    "N4: halve a done cell's metrics; without --resume the run refuses naming the file, with it the cell is re-run and the result is whole."
    out = _copy(done_run, tmp_path / "c1"); shutil.rmtree(out / NAME)
    c = _train_cell(tiny); m = out / ".cells" / c.key / "metrics.csv"
    good = m.read_text(); lines = good.splitlines(); m.write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    with pytest.raises(ValueError, match="damaged.*metrics.csv"): reproduce(NAME, "smoke", out=out, log=None)
    said = []
    res = reproduce(NAME, "smoke", out=out, log=said.append, resume=True)
    assert any("running it again" in l for l in said) and any("1 to run" in l for l in said)
    assert cell_problem(c, out / ".cells") is None
    assert pd.read_csv(m).step.max() == c.spec["train"]["steps"]
    assert res[NAME]["config_hash"] == tiny.config_hash("smoke")
    again, before = (pd.DataFrame(json.loads((f / NAME / "summary.json").read_text())["per_seed"]) for f in (out, done_run))
    pd.testing.assert_frame_equal(again, before, rtol=1e-4)   # the cell ran alone this time, batched before: equal up to rounding


# ---------------------------------------------------------------- N2: cells die with their runner
def _start_and_wait_for_a_cell(cmd, out:Path, timeout:float=120)->subprocess.Popen:
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    while time.time() < deadline and not _cell_processes(str(out)): time.sleep(0.1)
    assert _cell_processes(str(out)), "no cell process started"
    time.sleep(2.0)   # the cell is training now
    return p


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_cells_die_with_their_runner(tiny, tmp_path, sig, monkeypatch):
    "N2: kill -9 or kill -TERM the runner (--jobs 2): its cell processes end too; TERM prints one line and exits 130."
    monkeypatch.setenv(LONG_ENV, "300")   # Phase II jobs of several seconds, so that the signal comes while one trains (the run and its resume alike)
    out = tmp_path / f"k{int(sig)}"
    p = _start_and_wait_for_a_cell(TINY + ["reproduce", NAME, "--size", "smoke", "--out", str(out), "--jobs", "2"], out)
    assert _cell_processes(str(out)), "no cell was running when the signal came: make the cells longer (TINY_SMOKE_STEPS)"
    p.send_signal(sig); _, err = p.communicate(timeout=60)
    assert _wait_gone(str(out)) == [], "cell processes outlived their runner"
    if sig == signal.SIGTERM: assert p.returncode == 130 and err.strip().splitlines()[-1].endswith("interrupted"), err
    r = subprocess.run(TINY + ["reproduce", NAME, "--size", "smoke", "--out", str(out), "--jobs", "2", "--resume"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.slow
def test_a_resume_that_meets_a_live_cell_says_so(tiny, tmp_path, capsys):
    "N2: an unfinished cell still held by a live process (an orphan of a killed run): --resume refuses in one line, naming it."
    out = tmp_path / "live"; c = cells(tiny, "smoke")[0]
    (out / ".cells" / c.key).mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from spline_transformers.core import FolderLock; "
                               "FolderLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)", str(out / ".cells" / c.key)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = subprocess.run(TINY + ["reproduce", NAME, "--size", "smoke", "--out", str(out), "--resume"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "still being trained" in r.stderr, r.stderr
        assert f"process {holder.pid}" in r.stderr
    finally:
        holder.kill(); holder.wait()


# ---------------------------------------------------------------- N12: concurrent runs, damaged files named
@pytest.mark.slow
def test_a_second_run_on_a_live_cells_folder_is_told_it_is_in_use(tiny, tmp_path):
    "N12, D9: while one run holds --out/.cells (and has unfinished cells), a second is told the folder is in use, not 'pass --resume'."
    out = tmp_path / "busy"; c = cells(tiny, "smoke")[0]
    (out / ".cells" / c.key).mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from spline_transformers.core import FolderLock; "
                               "FolderLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)", str(out / ".cells")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = subprocess.run(TINY + ["reproduce", NAME, "--size", "smoke", "--out", str(out)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "in use" in r.stderr and "--resume" not in r.stderr, r.stderr
    finally:
        holder.kill(); holder.wait()


def test_damaged_result_and_phase1_files_are_named(tiny, done_run, tmp_path):
    "N12: a truncated provenance.json or phase1.json is named in a one-line error."
    out = _copy(done_run, tmp_path / "n12")
    (out / NAME / "provenance.json").write_text('{"size": "sm')
    with pytest.raises(ValueError, match="provenance.json: this provenance is not valid JSON"): load_result(NAME, out)
    p1 = next(c for c in cells(tiny, "smoke") if c.spec["kind"] == "phase1")
    (out / ".cells" / p1.key / "phase1" / "phase1.json").write_text("[")
    assert "phase1.json" in cell_problem(p1, out / ".cells")
    with pytest.raises(ValueError, match=r"phase1\.json: this phase1.json is not valid JSON"):
        ex.summarise(tiny, "smoke", out)


# ---------------------------------------------------------------- N9, N10: bad device, too many jobs
def test_a_bad_device_is_refused_before_anything_is_written(tmp_path, capsys):
    "N9: --device bogus exits 2 with one line and writes nothing."
    out = tmp_path / "dev"
    assert main(["reproduce", "add", "--size", "smoke", "--out", str(out), "--device", "bogus"]) == 2
    assert "bogus" in _one_line_error(capsys) and not out.exists()


def test_more_jobs_than_cpus_is_refused(tmp_path, capsys):
    "N10: --jobs 100000 exits 2 with one line naming the CPU count, before any process starts."
    out = tmp_path / "jobs"
    assert main(["reproduce", "add", "--size", "smoke", "--out", str(out), "--jobs", "100000"]) == 2
    assert "CPUs" in _one_line_error(capsys) and not out.exists()


# ---------------------------------------------------------------- D9: one run per --out
@pytest.mark.parametrize("argv", [["demo", "--quick"], ["phase1", "--task", "add", "--steps", "2"]])
def test_two_runs_never_share_an_out_folder(tmp_path, argv, capsys):
    "D9: while another process holds --out, demo and phase1 refuse in one line before any work."
    out = tmp_path / "o"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from spline_transformers.core import FolderLock; "
                               "FolderLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)", str(out)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(argv + ["--out", str(out)]) == 2
        assert "in use" in _one_line_error(capsys)
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    finally:
        holder.kill(); holder.wait()


# ---------------------------------------------------------------- a stale result is never shown without a word
def test_a_stale_result_says_so(tmp_path):
    "load_result warns and names the staleness; findings_table marks the row."
    out = tmp_path / "res"; _copy(ROOT / "results" / "add", out / "add")
    with warnings.catch_warnings():
        warnings.simplefilter("error"); assert load_result("add", out)["stale"] is None
    s = json.loads((out / "add" / "summary.json").read_text()); s["config_hash"] = "feedfacefeedface"
    (out / "add" / "summary.json").write_text(json.dumps(s))
    with pytest.warns(StaleResult, match="stale"): r = load_result("add", out)
    assert "--overwrite" in r["stale"]
    f = findings_table(out).set_index("experiment")
    assert "stale" in f.loc["add", "ours"]


# ---------------------------------------------------------------- registration before the run (issue 26)
def test_an_unregistered_cpu_run_is_refused_in_a_ledgered_folder(tiny, tmp_path):
    (tmp_path / "registrations.json").write_text("{}")   # a results folder that keeps a ledger, with nothing registered
    with pytest.raises(ValueError, match="not registered"): reproduce(NAME, "cpu", out=tmp_path, log=None)
    assert not (tmp_path / ".cells").exists()   # refused before anything was written


def test_redecide_decides_a_committed_result_again_and_refuses_other_cells(tmp_path):
    from spline_transformers.runner import redecide
    results = Path(__file__).parents[1] / "results"
    shutil.copytree(results / "add", tmp_path / "add"); shutil.copy(results / "registrations.json", tmp_path)
    before = json.loads((tmp_path / "add" / "summary.json").read_text())
    after = redecide("add", tmp_path, command="test")
    assert [v["verdict"] for v in after["verdicts"]] == [v["verdict"] for v in before["verdicts"]]
    assert [round(v["estimate"], 9) for v in after["verdicts"]] == [round(v["estimate"], 9) for v in before["verdicts"]]
    assert json.loads((tmp_path / "add" / "provenance.json").read_text())["decided"]["command"] == "test"
    s = json.loads((tmp_path / "add" / "summary.json").read_text()); s["cells_hash"] = "0" * 16
    (tmp_path / "add" / "summary.json").write_text(json.dumps(s))
    with pytest.raises(ValueError, match="other cells"): redecide("add", tmp_path)
    s["cells_hash"] = before["cells_hash"]; (tmp_path / "add" / "summary.json").write_text(json.dumps(s))
    m = pd.read_csv(tmp_path / "add" / "metrics.csv.gz"); write_table(m[m.seed != 9], tmp_path / "add" / "metrics.csv.gz")
    with pytest.raises(ValueError, match="arms and seeds"): redecide("add", tmp_path)


def test_cells_waiting_for_the_last_running_job_run_when_it_ends(tiny, tmp_path, monkeypatch):
    """A resume whose one running job is the Phase I cell the other cells wait for (the standard arm done before a kill):
    when it ends, the scheduler asks again which cells are ready, instead of reporting them as waiting for unscheduled cells.
    The scheduler's pause is stretched to 3 s so that the job writes its answer and exits within one pause, as a fast one does."""
    from spline_transformers.runner import run_scheduled
    sleep = time.sleep
    monkeypatch.setattr(ex.time, "sleep", lambda s: sleep(max(s, 3.0)))
    root = tmp_path / ".cells"
    left = {c.key: c for c in cells(tiny, "smoke") if "/standard/" not in c.label}
    assert any(c.spec["kind"] == "phase1" for c in left.values()) and all(c.deps for c in left.values() if c.spec["kind"] == "train")
    run_scheduled(left, root, jobs=2)
    assert all((root / k / "done.json").is_file() for k in left)
