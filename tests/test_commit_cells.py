"""A run longer than a session (chapter 9c): `tools/commit_cells.py` commits the done cells of a run in progress, never its
scratch; a fresh clone resumes from them; the result's cells leave git once it is written. On the registered `tiny`
experiment at its cpu size (seconds), in a git repository of its own."""
import json, subprocess, sys
from pathlib import Path

import pytest

from spline_transformers.runner import reproduce, run_cell, run_progress, runs_in_progress, work_cells

sys.path.insert(0, str(Path(__file__).parent))
from tiny_experiment import NAME, tiny  # noqa: E402,F401  (tiny: the fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import commit_cells  # noqa: E402


def _git(repo, *args)->str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path, tiny):
    "A git repository whose results/ ledger registers `tiny` at cpu size and ignores results/.cells, as the book's does."
    r = tmp_path / "repo"; (r / "results").mkdir(parents=True)
    _git(r, "init", "-q"); (r / ".gitignore").write_text("results/.cells/\n")
    (r / "results" / "registrations.json").write_text(json.dumps(
        {NAME: [{"config_hash": tiny.config_hash("cpu"), "size": "cpu", "commit": "0" * 40, "date": "2026-12-07T00:00:00+00:00", "statistic": ""}]}))
    return r


def test_done_cells_travel_and_a_clone_runs_only_the_rest(repo, tmp_path, tiny):
    run = tmp_path / "run"; cs = work_cells(tiny, "cpu")
    run_cell(cs[0], run / ".cells")                                 # the Phase I cell done, then the session ended
    (run / ".cells" / cs[1].key / "ckpt").mkdir(parents=True)       # a cell under way: its checkpoint only
    (run / ".cells" / cs[1].key / "ckpt" / "step-5.safetensors").write_bytes(b"x")
    added = commit_cells.commit([NAME], run, repo / "results")
    assert added == [cs[0].label]
    tracked = _git(repo, "ls-files", "results/.cells").split()
    assert tracked and all(p.startswith(f"results/.cells/{cs[0].key}/") for p in tracked)
    assert not [p for p in tracked if p.endswith(("log.txt", ".lock")) or "/ckpt" in p]   # results only, never scratch
    files = {p.split("/", 3)[3] for p in tracked}
    assert {"done.json", "metrics.csv", "phase1/nonlinearities.safetensors", "phase1/best.safetensors"} <= files and "phase1/metrics.csv" not in files   # no copies
    assert commit_cells.commit([NAME], run, repo / "results") == []   # already there
    assert run_progress(NAME, repo / "results")["done"] == 1 and list(runs_in_progress(repo / "results")) == [NAME]
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "cells")
    clone = tmp_path / "clone"; _git(tmp_path, "clone", "-q", str(repo), str(clone))
    lines = []
    reproduce(NAME, "cpu", jobs=2, out=clone / "results", resume=True, log=lines.append)
    assert f"{len(cs)} cells, 1 already done, {len(cs) - 1} to run" in lines[0], lines[0]   # the clone ran only the rest
    with pytest.raises(SystemExit, match="its result is in"): commit_cells.commit([NAME], run, clone / "results")
    assert len(commit_cells.drop([NAME], clone / "results")) == 1
    assert _git(clone, "ls-files", "results/.cells") == "" and (clone / "results" / ".cells" / cs[0].key / "done.json").is_file()   # out of git, on disk


def test_a_run_resumed_in_results_commits_its_new_cells_in_place(repo, tiny):
    "After the first hand-off the run goes on in results/ itself: its new done cells are added where they are; cells already in git are left."
    cs = work_cells(tiny, "cpu"); res = repo / "results"
    run_cell(cs[0], res / ".cells")
    assert commit_cells.commit([NAME], res, res) == [cs[0].label]
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first chunk")
    run_cell(cs[1], res / ".cells")                                  # the next session's chunk, in place
    assert commit_cells.commit([NAME], res, res) == [cs[1].label]   # only the new one
    assert {p.split("/")[2] for p in _git(repo, "ls-files", "results/.cells").split()} == {cs[0].key, cs[1].key}


def test_refusals(repo, tmp_path, tiny):
    with pytest.raises(SystemExit, match="no cells folder"): commit_cells.commit([NAME], tmp_path / "nothing", repo / "results")
    with pytest.raises(SystemExit, match="keep them"): commit_cells.drop([NAME], repo / "results")   # no result yet
    (repo / "results" / "registrations.json").write_text("{}")
    (tmp_path / "run" / ".cells").mkdir(parents=True)
    with pytest.raises(SystemExit, match="not registered"): commit_cells.commit([NAME], tmp_path / "run", repo / "results")
    with pytest.raises(ValueError, match="no_such"): commit_cells.commit(["no_such"], tmp_path / "run", repo / "results")


@pytest.fixture
def tiny2(tiny):
    "A second registered experiment that shares `tiny`'s Phase I cell (the same specification, so the same key) and trains other seeds."
    from dataclasses import replace
    from spline_transformers.experiments import EXPERIMENTS, register
    exp = register(replace(tiny, name="tiny2", sizes={s: replace(st, seeds=(2, 3)) for s, st in tiny.sizes.items()}))
    yield exp
    EXPERIMENTS.pop("tiny2", None)


def test_drop_keeps_the_cells_another_run_in_progress_needs(repo, tiny, tiny2):
    res = repo / "results"
    ledger = json.loads((res / "registrations.json").read_text())
    ledger["tiny2"] = [{**ledger[NAME][0], "config_hash": tiny2.config_hash("cpu")}]; (res / "registrations.json").write_text(json.dumps(ledger))
    reproduce(NAME, "cpu", jobs=1, out=res, log=None)                       # tiny's result, its cells in results/.cells
    p1 = next(c for c in work_cells(tiny, "cpu") if c.spec["kind"] == "phase1")
    mine = next(c for c in work_cells(tiny2, "cpu") if p1.key in c.deps)     # a tiny2 cell trained on the shared Phase I run
    assert p1.key in {c.key for c in work_cells(tiny2, "cpu")} and not {c.key for c in work_cells(tiny2, "cpu")} - {p1.key} & {c.key for c in work_cells(tiny, "cpu")}
    run_cell(mine, res / ".cells")
    assert sorted(commit_cells.commit(["tiny2"], res, res)) == sorted([mine.label, "tiny2/phase1/mlp_r0"])   # its own cell, and the shared one it needs
    assert list(runs_in_progress(res)) == ["tiny2"] and run_progress("tiny2", res)["own"] == 1
    assert commit_cells.drop([NAME], res) == []                             # the shared Phase I cell stays: tiny2 still needs it
    assert p1.key in {p.split("/")[2] for p in _git(repo, "ls-files", "results/.cells").split()}
