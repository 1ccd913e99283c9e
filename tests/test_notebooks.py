"""Every chapter runs as a pytest test (one per notebook), so a failure names the chapter.

Each notebook runs from a staged copy in `_build/nbs/` and is saved there with its outputs, which the docs build
(`tools/build_docs.py`) then reuses instead of executing the chapter a second time. Cells tagged `#| slow` or
`#| gpu` are skipped unless NBDEV_FLAGS names them, e.g. NBDEV_FLAGS="slow gpu".
"""
import os, time
from pathlib import Path

import pytest

from conftest import DEMO_ENV, SMOKE_ENV, build_docs, needs_demo, needs_smoke, shared_dir

NOTEBOOKS = build_docs.chapters()
SKIP_FLAGS = build_docs.SKIP_FLAGS


def _skip_flags():
    "Flags to skip: `slow` and `gpu`, minus the ones NBDEV_FLAGS asks to run."
    run = set(os.environ.get("NBDEV_FLAGS", "").split())
    return [f for f in SKIP_FLAGS if f not in run]


@pytest.fixture(scope="session")
def staged(tmp_path_factory):
    "`nbs/` staged into `_build/nbs/` once per test run (the first xdist worker to get here stages; the others wait)."
    done = shared_dir(tmp_path_factory) / "staged"
    try: (shared_dir(tmp_path_factory) / "staging").mkdir()
    except FileExistsError:
        while not done.exists(): time.sleep(0.2)
        return Path(done.read_text())
    folder = build_docs.stage(force=True)
    done.write_text(str(folder))
    return folder


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook(nb, staged, request, monkeypatch):
    if needs_smoke(request.node):   # the chapter shows a smoke run: it reads the session's one run instead of starting its own
        out, r = request.getfixturevalue("smoke_run")
        assert r.returncode == 0, f"the session's smoke run failed: {r.stderr[-2000:]}"
        monkeypatch.setenv(SMOKE_ENV, str(out))
    if needs_demo(request.node):    # the same for `demo --quick`
        out, p = request.getfixturevalue("demo_run")
        assert p.returncode == 0, p.stderr[-3000:]
        monkeypatch.setenv(DEMO_ENV, str(out))
    ok = build_docs.execute(staged / nb.relative_to(build_docs.NBS), _skip_flags())
    assert ok, f"{nb.name} failed (its traceback is printed above)"


# ---------------------------------------------------------------- the house: reading order and module boundaries
import ast, importlib, json, re
from pathlib import Path

PKG = Path(build_docs.NBS).parent / "spline_transformers"


def _cells(nb):
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in json.loads(Path(nb).read_text())["cells"] if c["cell_type"] == "code"]


def _module_of(nb):
    "The module a chapter builds (`#| default_exp name`), or None."
    for src in _cells(nb):
        m = re.search(r"^#\|\s*default_exp\s+(\S+)", src, re.M)
        if m: return m.group(1)
    return None


def _imported_modules(src):
    "Package modules a cell imports: `from spline_transformers.x import`, `import spline_transformers.x`, `from spline_transformers import x`."
    found = set(re.findall(r"^\s*(?:from|import)\s+spline_transformers\.(\w+)", src, re.M))
    for names in re.findall(r"^\s*from\s+spline_transformers\s+import\s+\(?([\w\s,]+)\)?", src, re.M):
        found |= {n.split(" as ")[0].strip() for n in names.split(",") if n.strip()}
    return found


def test_there_are_chapters():
    "Every package module is built by exactly one chapter, and the front page is there."
    built = {}
    for nb in NOTEBOOKS:
        m = _module_of(nb)
        if m: built.setdefault(m, []).append(nb.name)
    modules = {p.stem for p in PKG.glob("*.py") if not p.stem.startswith("_")}
    assert set(built) == modules, (sorted(modules - set(built)), sorted(set(built) - modules))
    assert all(len(v) == 1 for v in built.values()), {k: v for k, v in built.items() if len(v) > 1}
    assert "index.ipynb" in {nb.name for nb in NOTEBOOKS}


def test_the_folders_of_nbs_are_the_parts_of_the_book():
    """`nbs/` is laid out by part (`build_docs.PARTS`): every chapter but the front page sits in a part's folder; the chapters
    of `measured/` report committed results and build no module, and every other chapter builds one; and the folders keep
    the chapters' numbers in reading order."""
    for nb in NOTEBOOKS:
        rel = nb.relative_to(build_docs.NBS)
        if rel == Path("index.ipynb"): continue
        assert rel.parent.as_posix() in build_docs.PARTS, f"{rel}: not in a part's folder {sorted(build_docs.PARTS)}"
        measured = rel.parent.name == "measured"
        assert (_module_of(nb) is None) == measured, f"{rel}: {'a measured chapter builds a module' if measured else 'builds no module: it belongs in measured/'}"
    stems = [nb.stem for nb in NOTEBOOKS if nb.name != "index.ipynb"]
    assert stems == sorted(stems), "the parts' folders put the chapters out of their numbers' order"
    assert NOTEBOOKS[-1].name == "index.ipynb"


def test_the_committed_sidebar_is_the_parts():
    "`nbs/sidebar.yml` (what `nbdev-docs` shows; `custom_sidebar = true`) lists every chapter, a section a part, in reading order."
    assert (build_docs.NBS / "sidebar.yml").read_text() == build_docs.sidebar_text(build_docs.NBS), \
        "nbs/sidebar.yml is out of date: run `python tools/build_docs.py --sidebar`"


def test_chapters_import_only_earlier_chapters():
    "The book's promise: a chapter (exported cells or not) imports only modules built by chapters before it."
    order = [nb.name for nb in NOTEBOOKS]   # reading order
    chapter = {_module_of(nb): nb.name for nb in NOTEBOOKS if _module_of(nb)}
    late = []
    for nb in NOTEBOOKS:
        for src in _cells(nb):
            for mod in _imported_modules(src) - {_module_of(nb)}:
                if mod in chapter and order.index(chapter[mod]) >= order.index(nb.name): late.append((nb.name, mod, chapter[mod]))
    assert not late, f"chapters importing a module built later (chapter, module, its chapter): {sorted(set(late))}"


# Every chapter opens with the object it is named after: a reader meets `Task` before the helpers it rests on.
NAMESAKES = {  # chapter -> its first exported def or class
    "00_viz": "BookRenderer", "01_splines": "LinearSpline", "02_attention": "attend", "03_model": "TransformerConfig",
    "04_ensemble": "Ensemble", "05_tasks": "Task", "06_corpora": "load_corpus", "07_train": "TrainConfig",
    "08_two_phase": "Phase1Config", "09_experiments": "Experiment", "08a_stats": "Verdict", "09c_runner": "reproduce",
    "09d_results": "load_result", "09e_report": "Report", "09f_calibration": "pilot_setting", "10_distributed": "distributed_phase1",
    "20_interpolation": "ExactInterpolator", "21_interpolation_theory": "stage_snapshots_figure",
    "10a_editor": "SplineEditor", "22_cli": "build_parser", "30_widgets": "collapse_figure",
}
NO_NAMESAKE = {"00_core", "09b_registry"}   # the ground floor: helpers only; the registry: data (register calls), no object of its own


def _exported_defs(nb):
    "Names of the top-level functions and classes of a chapter's `#| export` cells (not `exporti`), in order."
    names = []
    for src in _cells(nb):
        if not re.search(r"^#\|\s*export\s*$", src, re.M): continue
        code = "\n".join("" if l.lstrip().startswith(("%", "!")) else l for l in src.splitlines())
        names += [n.name for n in ast.parse(code).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return names


def test_first_exported_object_is_the_chapters_namesake():
    "A chapter's first exported def/class (private helpers included) is the object the chapter is named after."
    with_module = {nb.stem: nb for nb in NOTEBOOKS if _module_of(nb)}
    assert set(with_module) == set(NAMESAKES) | NO_NAMESAKE, \
        f"add each chapter to NAMESAKES (or NO_NAMESAKE): {sorted(set(with_module) ^ (set(NAMESAKES) | NO_NAMESAKE))}"
    wrong = {ch: (defs[:3], NAMESAKES[ch]) for ch, nb in with_module.items() if ch in NAMESAKES
             for defs in [_exported_defs(nb)] if defs[:1] != [NAMESAKES[ch]]}
    assert not wrong, f"chapters whose first exported object is not their namesake (first objects, expected): {wrong}"


def test_no_private_name_is_imported_across_modules():
    "Modules use each other's public names only: no `from .x import _y`, no `x._y` on a package module."
    bad = []
    for f in sorted(PKG.glob("*.py")):
        if f.stem.startswith("_"): continue
        tree = ast.parse(f.read_text())
        aliases = {}   # local name -> package module, from `from . import x as y` / `import spline_transformers.x as y`
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.level == 1 or (n.module or "").startswith("spline_transformers")):
                mod = n.module if n.level else (n.module or "").removeprefix("spline_transformers").lstrip(".")
                for a in n.names:
                    if not mod: aliases[a.asname or a.name] = a.name
                    elif a.name.startswith("_"): bad.append(f"{f.name}: from {mod} import {a.name}")
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases and n.attr.startswith("_"):
                bad.append(f"{f.name}: {n.value.id}.{n.attr}")
    assert not bad, bad


MAX_MODULE_LINES, MAX_CELL_LINES = 700, 100  # the house's sizes: past them, the chapter says why


def test_long_modules_and_cells_say_why():
    "No module over ~700 lines without a '**Why one module.**' paragraph in its chapter; no exported cell over ~100 lines without '# Why one cell:'."
    unexplained = []
    for nb in NOTEBOOKS:
        mod = _module_of(nb)
        if not mod: continue
        cells = json.loads(nb.read_text())["cells"]
        text = lambda c: c["source"] if isinstance(c["source"], str) else "".join(c["source"])
        n = len((PKG / f"{mod}.py").read_text().splitlines())
        if n > MAX_MODULE_LINES and not any(c["cell_type"] == "markdown" and "**Why one module.**" in text(c) for c in cells):
            unexplained.append(f"{mod}.py has {n} lines")
        for c in cells:
            s = text(c)
            if c["cell_type"] == "code" and re.match(r"#\|\s*export\s*\n", s) and len(s.splitlines()) > MAX_CELL_LINES and "# Why one cell:" not in s:
                unexplained.append(f"{nb.name}: an exported cell of {len(s.splitlines())} lines ({s.splitlines()[1][:50]!r})")
    assert not unexplained, unexplained


# One process runner (issue 24): work runs in other processes only through `core.ChildProcess`. Running a tool and
# reading its output (`subprocess.run` of git or pip) is not a runner; starting processes that live beside this one is.
PROCESS_STARTS = {"Popen", "ProcessPoolExecutor", "fork", "forkpty", "multiprocessing"}
PROCESS_STARTERS = {  # module -> (the one function allowed to start processes, None: the whole module; why)
    "core": (None, "the one process runner: `ChildProcess`, `run_in_processes`"),
    "distributed": ("launch", "starts torchrun, which starts the ranks of a distributed job: no measured work of its own"),
}


def _process_starts(tree):
    "(top-level function or None, what) for each process start in a module: subprocess.Popen, multiprocessing, ProcessPoolExecutor, os.fork."
    found = []
    for top in tree.body:
        fn = top.name if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
        for n in ast.walk(top):
            if isinstance(n, ast.Import): names = [a.name.split(".")[0] for a in n.names]
            elif isinstance(n, ast.ImportFrom): names = [(n.module or "").split(".")[0]] + [a.name for a in n.names]
            elif isinstance(n, ast.Attribute): names = [n.attr] if n.attr not in ("fork", "forkpty") or getattr(n.value, "id", None) == "os" else []
            elif isinstance(n, ast.Name): names = [n.id]
            else: continue
            found += [(fn, w) for w in names if w in PROCESS_STARTS]
    return found


def test_one_process_runner():
    "No package module starts processes of its own (subprocess.Popen, multiprocessing, ProcessPoolExecutor, os.fork) except `core`'s runner and the exceptions named above."
    bad = []
    for f in sorted(PKG.glob("*.py")):
        if f.stem.startswith("_"): continue
        allowed = PROCESS_STARTERS.get(f.stem, ("", ""))[0]
        bad += [f"{f.name}: {what} in {fn or 'module level'}" for fn, what in _process_starts(ast.parse(f.read_text()))
                if allowed is not None and fn != allowed]
    assert not bad, f"start processes with core.ChildProcess (or add a reasoned exception): {bad}"
    assert _process_starts(ast.parse("import multiprocessing\ndef f():\n    subprocess.Popen([]); os.fork()")) == \
        [(None, "multiprocessing"), ("f", "Popen"), ("f", "fork")]   # the rule sees what it looks for


def _calls(tree, name):
    "Top-level functions (None: module level) of a module that call `name`."
    out = []
    for top in tree.body:
        fn = top.name if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
        out += [fn for n in ast.walk(top) if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == name]
    return out


def test_one_transfer_matrix():
    "A transfer matrix is built in one place, `two_phase.assemble_transfer`; every matrix of the package (registered, CLI, distributed) goes through it."
    trees = {f.stem: ast.parse(f.read_text()) for f in sorted(PKG.glob("*.py")) if not f.stem.startswith("_")}
    built = {(m, fn) for m, t in trees.items() for fn in _calls(t, "TransferMatrix")}
    assert built == {("two_phase", "assemble_transfer")}, built
    users = {(m, fn) for m, t in trees.items() for fn in _calls(t, "assemble_transfer")}
    assert {("runner", "_transfer_decisions"), ("runner", "run_transfer"), ("distributed", "distributed_transfer")} <= users, users
    by_target = [(m, n.lineno) for m, t in trees.items() for n in ast.walk(t) if isinstance(n, ast.Call)
                 and getattr(n.func, "attr", None) == "pivot" and any(k.arg == "columns" and getattr(k.value, "value", None) == "target" for k in n.keywords)]
    assert not by_target, f"a (row, target) matrix built outside assemble_transfer (the old second implementation pivoted its own): {by_target}"


def test_one_verdict_rule():
    "A verdict is decided in one place, `stats.decide` (and `decide_diagonal` for a transfer matrix): the runner's results and the reports'"
    " ad-hoc comparisons call it, and no other function returns a judgement of its own (the old `report.verdict` had a three-way rule)."
    trees = {f.stem: ast.parse(f.read_text()) for f in sorted(PKG.glob("*.py")) if not f.stem.startswith("_")}
    users = {(m, fn) for m, t in trees.items() for fn in _calls(t, "decide")}
    assert {("runner", "_decisions"), ("report", "comparison_verdict")} <= users, users
    judged = sorted((m, n.name) for m, t in trees.items() for n in ast.walk(t) if isinstance(n, ast.FunctionDef)
                    and any(isinstance(k, ast.Constant) and k.value in ("helped", "not helped") for k in ast.walk(n)))
    assert not judged, f"functions that judge a comparison by a rule of their own: {judged}"
    assert not hasattr(importlib.import_module("spline_transformers.report"), "verdict")


def test_imports_have_cells_of_their_own():
    "A chapter cell with an import and other code is run by nbdev when it builds the site, without the cells before it: imports get cells of their own."
    mixed = []
    for nb in NOTEBOOKS:
        for src in _cells(nb):
            first = src.split("\n")[0]
            if first.startswith(("#| hide", "#| export", "#| default_exp")): continue
            try: tree = ast.parse("\n".join("" if l.lstrip().startswith(("%", "!", "#|")) else l for l in src.splitlines()))
            except SyntaxError: continue
            kinds = {isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body}
            if kinds == {True, False}: mixed.append(f"{nb.name}: {first[:60]!r}")
    assert not mixed, mixed
