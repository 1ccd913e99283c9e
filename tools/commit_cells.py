"""Commit the done cells of a run longer than a session, so that another checkout resumes it (chapter 9c, "A run longer than a session").

    python tools/commit_cells.py NAME [NAME ...] --from RUN   # copy NAME's done, intact cpu cells from RUN/.cells into results/.cells; git add them
    python tools/commit_cells.py NAME [NAME ...] --drop       # NAME's result is written: take its cells out of git (the files stay on disk)

Only a cell's results travel (`runner.cell_result_files`: never its checkpoints, log or lock); `results/.cells` is otherwise
ignored, so the files are added with `git add -f`. A fresh clone then runs the rest with
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


def _git(results, *args):
    subprocess.run(["git", *args], cwd=Path(results).parent, check=True)


def commit(names, run, results=RESULTS):
    "Copy the done, intact cells of `names` from `run`/.cells to results/.cells and `git add -f` their result files; returns how many were added."
    from spline_transformers.experiments import registration
    from spline_transformers.runner import cell_problem, cell_result_files, run_progress
    todo = _cells(names)   # refuses an unknown name first
    results = Path(results); src, dst = Path(run) / ".cells", results / ".cells"
    if not src.is_dir(): raise SystemExit(f"{src}: no cells folder; give --from the folder a run wrote with --out")
    if src.resolve() == dst.resolve(): raise SystemExit("--from is results itself; its cells are already in place: give the run's own --out folder")
    for n in names:
        if (results / n / "summary.json").is_file(): raise SystemExit(f"{n}: its result is in {results}; commit that, and --drop its cells")
        if registration(n, results) is None: raise SystemExit(f"{n}: its cpu configuration is not registered; register it before its cells are committed")
    added = []
    for key, c in todo.items():
        if cell_problem(c, src) is not None or cell_problem(c, dst) is None: continue   # not done there, or already here
        shutil.rmtree(dst / key, ignore_errors=True)
        files = cell_result_files(src / key)
        for f in files:
            (dst / key / f).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(src / key / f, dst / key / f)
        if cell_problem(c, dst) is not None: raise SystemExit(f"{c.label}: its copy in {dst / key} is not intact: {cell_problem(c, dst)}")
        _git(results, "add", "-f", "--", *[str((dst / key / f).relative_to(results.parent)) for f in files]); added.append(c.label)
    for n in names:
        p = run_progress(n, results)
        print(f"{n}: {p['done']} of {p['cells']} cells done in results/.cells ({len([a for a in added if a.startswith(n + '/')])} added now)")
    return added


def drop(names, results=RESULTS):
    "Take the cells of `names` out of git (they stay on disk, ignored), once their results are written."
    results = Path(results)
    for n in names:
        if not (results / n / "summary.json").is_file():
            raise SystemExit(f"{n}: no result in {results} yet; its committed cells are how the next session resumes it: keep them")
    keys = [k for k in _cells(names) if (results / ".cells" / k).is_dir()]
    if keys: _git(results, "rm", "-r", "-q", "--cached", "--ignore-unmatch", "--", *[f"{results.name}/.cells/{k}" for k in keys])
    print(f"{', '.join(names)}: {len(keys)} cells taken out of git")


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
