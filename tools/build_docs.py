"""Build the documentation site offline into `_docs/`, from a clean checkout.

    python tools/build_docs.py            # execute the chapters (or reuse fresh executions), render, check
    python tools/build_docs.py --flags "slow gpu"   # also run the cells tagged #| slow / #| gpu

The book's notebooks sit in `nbs/` in one folder per part (`PARTS`, in reading order); the site keeps the folders, as
Quarto does, and its sidebar shows each part as a section.

Steps (Quarto cannot be installed here; `nbdev-docs` still works wherever Quarto exists):
1. Stage `nbs/` into `_build/nbs/` and execute every chapter there (nbdev's test runner, `save=True`), so the
   pages show outputs that match the committed code. A staged notebook already executed by the test suite
   (`tests/test_notebooks.py` executes into the same folder) is reused when its cell sources equal the source's.
2. nbdev's own processing: `nbdev.yml`, the module index, `sidebar.yml` (written here: the parts as sections),
   `proc_nbs` → `_proc/` (renders `show_doc`, `#| hide`, front matter). fastcore renders every class's `show_doc` as
   its constructor, `def Name(...)->None:`; `render_classes` rewrites those blocks as classes: a dataclass as `@dataclass class Name:` with one line per field
   (type, default, docment), any other class as `class Name(Bases):` with its `def __init__(self, ...)`.
3. Copy a local `plotly.min.js` (from the plotly wheel) and KaTeX (from the npm registry, cached in
   `tools/vendor/`) into the site, render `_proc/` with `smalldocs` into `_docs/`, point the parts' pages at the root's
   KaTeX, and put the models the pages run (`spline_transformers/live/`, the editor chapter's `site_files`) beside the
   pages that run them.
"""
import argparse, dataclasses, importlib, json, os, re, shutil, subprocess, sys, tarfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS, STAGE, PROC, DOCS = ROOT / "nbs", ROOT / "_build" / "nbs", ROOT / "_proc", ROOT / "_docs"
VENDOR = ROOT / "tools" / "vendor"
KATEX_VERSION = "0.16.22"
SKIP_FLAGS = ["slow", "gpu"]


# The book's parts: each a folder of `nbs/` (and of the site), in reading order, with the title its sidebar section shows.
PARTS = {"1_building_blocks": "Part I: the building blocks",
         "2_learned_nonlinearities": "Part II: learned nonlinearities",
         "2_learned_nonlinearities/measured": "Measured: the paper's claims, tested",
         "3_exact_interpolation": "Part III: exact sequence interpolation",
         "4_interfaces": "Interfaces: the command line and live widgets"}


def _in_book(rel:Path)->bool:
    "Is this notebook (its path relative to `nbs/`) a chapter: no folder or file of its path starts with `_` or `.`?"
    return not any(part.startswith(("_", ".")) for part in rel.parts)


def chapters(folder=NBS):
    "The notebooks of the book, in reading order: the parts' folders in order, then the front page (`index.ipynb`)."
    folder = Path(folder)
    found = [p for p in folder.rglob("*.ipynb") if _in_book(p.relative_to(folder))]
    return sorted(found, key=lambda p: (p.parent == folder, p.relative_to(folder).as_posix()))


def chapter(stem:str, folder=NBS)->Path:
    "The notebook of the chapter named `stem` (e.g. '10a_editor'), wherever its part keeps it."
    hits = [p for p in chapters(folder) if p.stem == stem]
    if len(hits) != 1: raise FileNotFoundError(f"no single chapter {stem!r} under {folder} (found {hits}): the names are {[p.stem for p in chapters(folder)]}")
    return hits[0]


def _sources(nb_path):
    nb = json.loads(Path(nb_path).read_text())
    return [(c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"]) for c in nb["cells"]]


def page_path(nb:Path, folder=NBS)->str:
    "The page a chapter's notebook becomes in the site, from the site's root: `nbs/1_building_blocks/01_splines.ipynb` → `1_building_blocks/splines.html`."
    from nbdev.config import nbpath2html
    return nbpath2html(Path(nb).relative_to(folder)).as_posix()


def _tracked(folder:Path)->list:
    "The files of the book's source folder (not hidden ones): tracked by git or new, or every file where git cannot say (not a checkout)."
    try: r = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."], cwd=folder,
                            capture_output=True, text=True)
    except OSError: r = None   # no git
    rels = [Path(f) for f in r.stdout.split("\0") if f] if r is not None and r.returncode == 0 else \
           [p.relative_to(folder) for p in folder.rglob("*") if p.is_file()]
    return [rel for rel in rels if not any(part.startswith(".") for part in rel.parts) and (folder / rel).is_file()]


def stage(force=False):
    """Copy `nbs/` (its parts' folders as they are) into `_build/nbs/`, keeping staged notebooks whose sources are unchanged
    (they may hold fresh outputs); in a git checkout, what the chapters write while running (git ignores it) is not copied."""
    STAGE.mkdir(parents=True, exist_ok=True)
    wanted = set()
    for rel in _tracked(NBS):
        src, dst = NBS / rel, STAGE / rel
        wanted.add(rel)
        if src.suffix == ".ipynb" and dst.exists() and not force and _sources(src) == _sources(dst): continue
        dst.parent.mkdir(parents=True, exist_ok=True); shutil.copy2(src, dst)
    for dst in list(STAGE.rglob("*.ipynb")):   # a chapter moved or deleted in `nbs/` leaves the stage too
        if dst.relative_to(STAGE) not in wanted and _in_book(dst.relative_to(STAGE)): dst.unlink()
    return STAGE


def is_executed(nb_path):
    "Has this staged notebook been executed (by us or by the test suite)?"
    nb = json.loads(Path(nb_path).read_text())
    return nb.get("metadata", {}).get("spline_transformers", {}).get("executed", False)


def mark_executed(nb_path, flags):
    "Record in the staged notebook that it ran to the end, and with which skipped flags."
    nb = json.loads(Path(nb_path).read_text())
    nb.setdefault("metadata", {})["spline_transformers"] = {"executed": True, "skipped_flags": list(flags)}
    Path(nb_path).write_text(json.dumps(nb, indent=1, ensure_ascii=False))


TIMES = STAGE.parent / "chapter_times"   # one JSON file per chapter: its last execution's seconds and outcome


def execute(nb_path, skip_flags=SKIP_FLAGS):
    "Run one staged notebook in place with nbdev's test runner; True when every cell ran. Its time goes to `TIMES`."
    import nbdev.test as nbt
    ok, elapsed = nbt.test_nb(Path(nb_path), skip_flags=list(skip_flags), basepath=str(ROOT), save=True)
    if ok: mark_executed(nb_path, skip_flags)
    record_time(Path(nb_path).stem, elapsed, ok)
    return ok


def record_time(chapter, seconds, ok=True):
    "Write a chapter's execution time (what nbdev's runner returns) to `TIMES/<chapter>.json`."
    TIMES.mkdir(parents=True, exist_ok=True)
    (TIMES / f"{chapter}.json").write_text(json.dumps({"chapter": chapter, "seconds": round(float(seconds or 0), 2), "ok": bool(ok),
                                                       "finished": time.time()}))


def chapter_times(since=0.0):
    "{chapter: (seconds, ok)} of the executions recorded after `since` (a `time.time()`), slowest first."
    rows = [json.loads(f.read_text()) for f in TIMES.glob("*.json")] if TIMES.is_dir() else []
    rows = sorted((r for r in rows if r["finished"] >= since), key=lambda r: -r["seconds"])
    return {r["chapter"]: (r["seconds"], r["ok"]) for r in rows}


def times_table(times, n=None):
    "The lines of a table of chapter times, slowest first, with the total."
    items = list(times.items())[:n]
    lines = [f"{s:8.1f} s  {c}{'' if ok else '  (FAILED)'}" for c, (s, ok) in items]
    return lines + [f"{sum(s for s, _ in times.values()):8.1f} s  total of {len(times)} chapters"]


def vendor_katex():
    "A local KaTeX `dist/` folder, fetched once from the npm registry with `npm pack`."
    dist = VENDOR / f"katex-{KATEX_VERSION}" / "dist"
    if (dist / "katex.min.js").exists(): return dist
    VENDOR.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["npm", "pack", f"katex@{KATEX_VERSION}", "--silent"], cwd=VENDOR, check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    with tarfile.open(VENDOR / out) as tf: tf.extractall(VENDOR / "tmp-katex")
    shutil.rmtree(dist.parent, ignore_errors=True)
    shutil.move(str(VENDOR / "tmp-katex" / "package"), str(dist.parent))
    shutil.rmtree(VENDOR / "tmp-katex"); (VENDOR / out).unlink()
    return dist


def plotly_js():
    "The plotly.js bundled with the installed plotly wheel."
    import plotly
    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def sidebar_contents(folder=STAGE)->list:
    "The sidebar's `contents:`: the front page, then one section a part (`PARTS`), nested as the parts' folders are, in reading order."
    folder = Path(folder)
    unknown = sorted({p.parent.relative_to(folder).as_posix() for p in chapters(folder)} - set(PARTS) - {"."})
    if unknown: raise ValueError(f"chapters in folders that are not parts of the book: {unknown}; add each to PARTS in tools/build_docs.py")
    front, parts, sections = [], [], {}
    def section(part):   # a part's section, made (inside its parent's) where its first chapter comes
        if part not in sections:
            sections[part] = {"section": PARTS[part], "contents": []}
            parent = part.rpartition("/")[0]
            (section(parent)["contents"] if parent else parts).append(sections[part])
        return sections[part]
    for nb in chapters(folder):
        rel = nb.relative_to(folder)
        (front if rel.parent == Path(".") else section(rel.parent.as_posix())["contents"]).append(rel.as_posix())
    return front + parts


def sidebar_text(folder=NBS)->str:
    """The book's `sidebar.yml` (Quarto's format): the parts as sections, in reading order. `nbs/sidebar.yml` is committed
    (`custom_sidebar = true`: nbdev's own would name the sections by folder and drop the folders' numbers from the paths),
    so that `nbdev-docs` shows the same sidebar; `python tools/build_docs.py --sidebar` writes it."""
    import yaml
    head = "# Written by `python tools/build_docs.py --sidebar` from the parts' folders of nbs/ (build_docs.PARTS): do not edit.\n"
    return head + yaml.safe_dump({"website": {"sidebar": {"contents": sidebar_contents(folder)}}}, sort_keys=False)


def write_sidebar(folder=STAGE):
    "Write `sidebar.yml` into `folder` (`nbs/`, or the stage the site is built from)."
    (Path(folder) / "sidebar.yml").write_text(sidebar_text(folder))


def process():
    "nbdev's processing of the staged, executed notebooks into `_proc/`."
    from nbdev.quarto import refresh_quarto_yml
    from nbdev.serve import proc_nbs
    import nbdev.doclinks
    os.chdir(ROOT)
    refresh_quarto_yml()
    shutil.copy2(NBS / "nbdev.yml", STAGE / "nbdev.yml")
    nbdev.doclinks._build_modidx()
    write_sidebar()
    shutil.rmtree(PROC, ignore_errors=True)
    proc_nbs(str(STAGE), n_workers=2, force=True)   # fresh processes: in this one, ipywidgets' registry may hold every widget the
    # chapters made (after the notebook tests, ~170 MB), and nbdev writes it into every processed notebook
    render_classes()
    name_pages_like_quarto()
    return PROC


def _anno(a):
    "An annotation as written: strings and forward references as they are, types by fastcore's formatting."
    from fastcore.docments import _type_str
    if isinstance(a, str): return a
    return a.__forward_arg__ if hasattr(a, "__forward_arg__") else _type_str(a)


_DC_DEFAULTS = dict(init=True, repr=True, eq=True, order=False, unsafe_hash=False, frozen=False)


def _dataclass_source(cls, maxline=110):
    "`@dataclass class Name:` and one `name:type=default # docment` line per field, as the class is written."
    from fastcore.docments import docments
    params = cls.__dataclass_params__
    args = ", ".join(f"{k}={getattr(params, k)}" for k, v in _DC_DEFAULTS.items() if getattr(params, k) != v)
    docs = docments(cls) or {}
    lines = [f"@dataclass({args})" if args else "@dataclass", f"class {cls.__name__}:"]
    for f in dataclasses.fields(cls):
        line = f"    {f.name}:{_anno(f.type)}"
        if f.default is not dataclasses.MISSING: line += f"={f.default!r}"
        elif f.default_factory is not dataclasses.MISSING:
            line += f"=field(default_factory={getattr(f.default_factory, '__name__', repr(f.default_factory))})"
        if not f.init: line += "  # not an argument of the constructor"
        elif docs.get(f.name): line += f" # {docs[f.name]}"
        lines.append(line)
    if len(lines) == 2: lines.append("    pass")
    return _short_types("\n".join(lines))


def _base_name(b, cls):
    "How a base class is written: `nn.Module` for torch's, `module.Name` when it has the class's own name."
    if b.__module__.startswith("torch.nn."): return f"nn.{b.__name__}"
    return f"{b.__module__}.{b.__name__}" if b.__name__ == cls.__name__ else b.__name__


def _short_types(text):
    "Drop this package's module prefixes from annotations (`spline_transformers.model.Block` → `Block`)."
    return re.sub(r"\bspline_transformers\.(?:\w+\.)*(?=\w+)", "", text)


def _class_source(cls, maxline=110):
    "`class Name(Bases):` with the constructor `def __init__(self, ...)` (`...` when the class keeps an inherited generic one)."
    from fastcore.docments import DocmentText, _fmt_sig
    bases = ", ".join(_base_name(b, cls) for b in cls.__bases__ if b is not object)
    head = f"class {cls.__name__}({bases}):" if bases else f"class {cls.__name__}:"
    params = [(_short_types(p), d) for p, d in DocmentText(cls, maxline=maxline - 4).params]
    if all(p.startswith("*") for p, _ in params): return head + "\n    ..."
    flat = f"def __init__(self, {', '.join(p for p, _ in params)}):"
    if len(flat) + 4 <= maxline and not any(d for _, d in params): init = flat
    else:
        init = _fmt_sig("__init__", params, "):", maxline - 4)
        first, rest = init.split("\n", 1)
        init = f"{first}\n    self,\n{rest}" if "#" in rest.split("\n", 1)[0] else f"{first}\n    self, {rest.lstrip()}"
    return _short_types(head + "\n" + "\n".join("    " + l for l in init.splitlines()))


def _namedtuple_source(cls):
    "`class Name(NamedTuple):` and one `name:type=default # docment` line per field."
    from fastcore.docments import docments
    docs, annos = docments(cls) or {}, getattr(cls, "__annotations__", {})
    lines = [f"class {cls.__name__}(NamedTuple):"]
    for f in cls._fields:
        a = annos.get(f)
        line = f"    {f}" + (f":{_anno(a)}" if a is not None else "")
        if f in cls._field_defaults: line += f"={cls._field_defaults[f]!r}"
        if docs.get(f): line += f" # {docs[f]}"
        lines.append(line)
    return _short_types("\n".join(lines))


def class_source(cls, maxline=110):
    "How the site shows the signature of class `cls`."
    if dataclasses.is_dataclass(cls): return _dataclass_source(cls, maxline)
    if issubclass(cls, tuple) and hasattr(cls, "_fields"): return _namedtuple_source(cls)
    return _class_source(cls, maxline)


_SHOWDOC_CLASS = re.compile(r"(### (?P<name>[\w.]+)\n\n```python\n)def (?P=name)\((?:.|\n)*?\n?```", re.M)
_SOURCE_LINK = re.compile(r"/(?P<path>[\w/]+)\.py#L\d+")


def _resolve(name, markdown):
    "The object a `show_doc` block documents, found from its source link (`pkg/mod.py#L12`), or None."
    m = _SOURCE_LINK.search(markdown)
    if not m: return None
    mod = m["path"].split("/")
    for i in range(len(mod)):
        try: obj = importlib.import_module(".".join(mod[i:]))
        except ImportError: continue
        for part in name.split("."): obj = getattr(obj, part, None)
        return obj
    return None


def render_classes(folder=None):
    "Rewrite the `show_doc` blocks of classes in the processed notebooks: `class`/`@dataclass`, not `def Name(...)->None:`."
    n = 0
    for nb_path in Path(folder or PROC).rglob("*.ipynb"):
        nb, changed = json.loads(nb_path.read_text()), False
        for cell in nb["cells"]:
            for out in cell.get("outputs", []):
                md = out.get("data", {}).get("text/markdown")
                if md is None: continue
                text = "".join(md) if isinstance(md, list) else md
                def sub(m):
                    obj = _resolve(m["name"], text)
                    if not isinstance(obj, type): return m.group(0)
                    return f"{m.group(1)}{class_source(obj)}\n```"
                new = _SHOWDOC_CLASS.sub(sub, text)
                if new != text: out["data"]["text/markdown"], changed, n = new, True, n + 1
        if changed: nb_path.write_text(json.dumps(nb, indent=1, ensure_ascii=False))
    return n


def name_pages_like_quarto():
    "Rename each processed notebook to its `output-file` (`1_building_blocks/00_viz.ipynb` → `1_building_blocks/viz.ipynb`), as Quarto names the pages."
    sidebar = PROC / "sidebar.yml"
    text = sidebar.read_text() if sidebar.exists() else ""
    for nb in PROC.rglob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        front = "".join(cells[0]["source"]) if cells and cells[0]["cell_type"] == "raw" else ""
        out = next((l.split(":", 1)[1].strip() for l in front.splitlines() if l.startswith("output-file:")), None)
        if not out or out == nb.with_suffix(".html").name: continue
        target = nb.with_name(Path(out).with_suffix(".ipynb").name)
        nb.rename(target)
        text = text.replace(nb.relative_to(PROC).as_posix(), target.relative_to(PROC).as_posix())
    if text: sidebar.write_text(text)


# KaTeX, which smalldocs links as `KATEX/...` from every page as if the page sat at the site's root. (`_quarto.yml`'s header
# finds plotly.js and `fit_figures.js` from any folder itself, so that a Quarto build gets them right too.)
ROOT_FILES = re.compile(r'(?P<attr>\b(?:src|href))="(?P<path>katex/)')


def reach_root_files(site:Path):
    "Point the pages of a part's folder at the root's KaTeX (`../` per level), as the root's pages do."
    for page in Path(site).rglob("*.html"):
        depth = len(page.relative_to(site).parts) - 1
        if depth == 0 or page.relative_to(site).parts[0] in ("site_libs", "katex"): continue
        text = page.read_text()
        fixed = ROOT_FILES.sub(lambda m: f'{m["attr"]}="{"../" * depth}{m["path"]}', text)
        if fixed != text: page.write_text(fixed)


def render():
    "Render `_proc/` with smalldocs into `_docs/`, with local plotly.js and KaTeX."
    import smalldocs.layout, smalldocs.site
    shutil.copy2(plotly_js(), PROC / "plotly.min.js")
    katex = vendor_katex()
    smalldocs.layout.KATEX = "katex"   # from the site's root (`reach_root_files` mends the parts' pages); the default is a CDN
    shutil.rmtree(DOCS, ignore_errors=True)
    site = smalldocs.site.build(str(PROC), quiet=True)
    built = Path(site.out if hasattr(site, "out") else PROC / "_docs")
    if built.resolve() != DOCS.resolve():
        shutil.rmtree(DOCS, ignore_errors=True); shutil.move(str(built), str(DOCS))
    shutil.copytree(katex, DOCS / "katex", dirs_exist_ok=True)
    if not (DOCS / "plotly.min.js").exists(): shutil.copy2(plotly_js(), DOCS / "plotly.min.js")
    reach_root_files(DOCS)
    from spline_transformers.editor import site_files    # the models the pages run (the editor chapter), fetched from beside them
    for folder in sorted({page.parent for page in DOCS.rglob("*.html") if "stLive.register(" in page.read_text()}):
        for rel, f in site_files().items(): (folder / rel).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(f, folder / rel)
    for w in getattr(site, "warnings", []): print(f"smalldocs warning: {w}", file=sys.stderr)
    return DOCS


class ChapterFailed(RuntimeError):
    "Some chapters failed to execute (a plain exception, so that a pytest fixture reports it as a failure)."


def build(skip_flags=SKIP_FLAGS, force=False, only_execute=False):
    "Stage, execute what is not fresh, process and render; returns the site folder."
    stage(force=force)
    failed, t0 = [], time.time()
    for nb in chapters(STAGE):
        if is_executed(nb) and not force: print(f"fresh  {nb.name}"); continue
        print(f"run    {nb.name}", flush=True)
        if not execute(nb, skip_flags): failed.append(nb.name)
    ran = chapter_times(since=t0)
    if ran: print("chapter times (slowest first):", *times_table(ran), sep="\n  ")
    if failed: raise ChapterFailed(f"build_docs: these chapters failed to execute: {failed}")
    if only_execute: return STAGE
    t = time.time(); process(); t_proc = time.time() - t
    t = time.time(); site = render()
    print(f"site: nbdev processing {t_proc:.0f} s, rendering {time.time() - t:.0f} s")
    return site


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flags", default="", help="cell flags to run, e.g. 'slow gpu' (default: skip them)")
    ap.add_argument("--force", action="store_true", help="re-execute every chapter")
    ap.add_argument("--sidebar", action="store_true", help="only write nbs/sidebar.yml (after adding, moving or renaming a chapter)")
    a = ap.parse_args()
    if a.sidebar: write_sidebar(NBS); print(NBS / "sidebar.yml"); raise SystemExit(0)
    run = set(a.flags.split())
    try: print(build(skip_flags=[f for f in SKIP_FLAGS if f not in run], force=a.force))
    except ChapterFailed as e: raise SystemExit(str(e)) from None
