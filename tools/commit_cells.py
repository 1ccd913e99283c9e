"""Commit the done cells of a run longer than a session, so that another checkout resumes it (chapter 9c, "A run longer than a session").

    python tools/commit_cells.py NAME [NAME ...] --from RUN   # NAME's done, intact cpu cells in RUN/.cells: copied into results/.cells, added to git
    python tools/commit_cells.py NAME [NAME ...] --drop       # NAME's result is written: take its cells out of git (the files stay on disk)

RUN is the --out folder of the run (results itself for a run resumed there). Only a cell's results travel
(`runner.cell_result_files`: never its checkpoints, log, lock or copies); `results/.cells` is otherwise ignored, so the files
are added with `git add -f`. A fresh clone then runs the rest with
`spline-transformers reproduce NAME --size cpu --jobs 2 --out results --resume`. Commit after running this.
"""
import argparse, shutil, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


def _cells(names):
    "key -> Cell for the cpu cells of `names` and the cells they depend on."
    from spline_transformers.runner import _pending, get_work
    for n in names: get_work(n)   # refuses an unknown name in one line
    return _pending(names, "cpu")


def _git(results, *args)->str:
    return subprocess.run(["git", *args], cwd=Path(results).parent, check=True, capture_output=True, text=True).stdout


def tracked_cells(results=RESULTS)->set:
    "The keys of the cells that git tracks under `results`/.cells."
    return {Path(f).parts[2] for f in _git(results, "ls-files", "--", f"{Path(results).name}/.cells").split()}


def commit(names, run, results=RESULTS)->list:
    "Copy the done, intact cells of `names` from `run`/.cells to `results`/.cells and `git add -f` their result files; returns the labels of the cells added."
    from spline_transformers.core import FolderLock
    from spline_transformers.experiments import EXPERIMENTS, registration
    from spline_transformers.runner import cell_problem, cell_result_files, run_progress
    todo = _cells(names)   # refuses an unknown name first
    results = Path(results); src, dst = Path(run) / ".cells", results / ".cells"
    if not src.is_dir(): raise SystemExit(f"{src}: no cells folder; give --from the folder a run wrote with --out")
    for n in names:
        if (results / n / "summary.json").is_file(): raise SystemExit(f"{n}: its result is in {results}; commit that, and --drop its cells")
        if n in EXPERIMENTS and registration(n, results) is None:   # runner kinds decide nothing and are not in the ledger
            raise SystemExit(f"{n}: its cpu configuration is not registered; register it before its cells are committed")
    here, added = tracked_cells(results), []
    copying = src.resolve() != dst.resolve()   # else a run resumed in results: its done cells are in place, only added
    lock = FolderLock(dst, "experiment cells folder") if copying else None   # no live run may write where cells are replaced
    if lock: lock.acquire()
    try:
        for key, c in todo.items():
            if cell_problem(c, src) is not None: continue   # not done there (or damaged: the run does it again)
            if copying and cell_problem(c, dst) is not None:
                shutil.rmtree(dst / key, ignore_errors=True)
                for f in cell_result_files(src / key):
                    (dst / key / f).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(src / key / f, dst / key / f)
                if cell_problem(c, dst) is not None: raise SystemExit(f"{c.label}: its copy in {dst / key} is not intact: {cell_problem(c, dst)}")
            if key in here: continue
            _git(results, "add", "-f", "--", *[f"{results.name}/.cells/{key}/{f}" for f in cell_result_files(dst / key)]); added.append(c.label)
    finally:
        if lock: lock.release()
    for n in names:
        p = run_progress(n, results)
        print(f"{n}: {p['done']} of {p['cells']} cells done in {dst} ({len(added)} added to git now)")
    return added


def drop(names, results=RESULTS)->list:
    "Take the cells of `names` out of git (they stay on disk, ignored) once their results are written, except those another run in progress needs; returns their keys."
    from spline_transformers.runner import _pending, runs_in_progress
    results = Path(results)
    for n in names:
        if not (results / n / "summary.json").is_file():
            raise SystemExit(f"{n}: no result in {results} yet; its committed cells are how the next session resumes it: keep them")
    others = [n for n in runs_in_progress(results) if n not in names]
    needed = set(_pending(others, "cpu")) if others else set()
    keys = sorted((set(_cells(names)) & tracked_cells(results)) - needed)
    if keys: _git(results, "rm", "-r", "-q", "--cached", "--", *[f"{results.name}/.cells/{k}" for k in keys])
    print(f"{', '.join(names)}: {len(keys)} cells taken out of git" + (f" ({len(needed & set(_cells(names)))} kept: {', '.join(others)} needs them)" if others else ""))
    return keys


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="+", help="registered experiments")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--from", dest="run", help="the --out folder of the run whose done cells to commit")
    g.add_argument("--drop", action="store_true", help="take the cells of finished experiments out of git")
    a = p.parse_args(argv)
    drop(a.names) if a.drop else commit(a.names, a.run)


if __name__ == "__main__":
    sys.exit(main())
