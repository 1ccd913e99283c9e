"""Build the documentation site offline into `_docs/`, from a clean checkout.

    python tools/build_docs.py            # execute the chapters (or reuse fresh executions), render, check
    python tools/build_docs.py --flags "slow gpu"   # also run the cells tagged #| slow / #| gpu

Steps (Quarto cannot be installed here; `nbdev-docs` still works wherever Quarto exists):
1. Stage `nbs/` into `_build/nbs/` and execute every chapter there (nbdev's test runner, `save=True`), so the
   pages show outputs that match the committed code. A staged notebook already executed by the test suite
   (`tests/test_notebooks.py` executes into the same folder) is reused when its cell sources equal the source's.
2. nbdev's own processing: `nbdev.yml`, the module index, `sidebar.yml`, `proc_nbs` → `_proc/` (renders `show_doc`,
   `#| hide`, front matter).
3. Copy a local `plotly.min.js` (from the plotly wheel) and KaTeX (from the npm registry, cached in
   `tools/vendor/`) into the site, and render `_proc/` with `smalldocs` into `_docs/`.
"""
import argparse, json, os, shutil, subprocess, sys, tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS, STAGE, PROC, DOCS = ROOT / "nbs", ROOT / "_build" / "nbs", ROOT / "_proc", ROOT / "_docs"
VENDOR = ROOT / "tools" / "vendor"
KATEX_VERSION = "0.16.22"
SKIP_FLAGS = ["slow", "gpu"]


def chapters(folder=NBS):
    "The notebooks of the book, in reading order."
    return sorted(p for p in Path(folder).glob("*.ipynb") if not p.name.startswith("_"))


def _sources(nb_path):
    nb = json.loads(Path(nb_path).read_text())
    return [(c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"]) for c in nb["cells"]]


def stage(force=False):
    "Copy `nbs/` into `_build/nbs/`, keeping staged notebooks whose sources are unchanged (they may hold fresh outputs)."
    STAGE.mkdir(parents=True, exist_ok=True)
    for src in NBS.iterdir():
        if src.name.startswith(".") or src.name == "spline_transformers": continue
        dst = STAGE / src.name
        if src.is_dir():
            shutil.rmtree(dst, ignore_errors=True); shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        elif src.suffix == ".ipynb" and dst.exists() and not force and _sources(src) == _sources(dst): continue
        else: shutil.copy2(src, dst)
    for dst in STAGE.glob("*.ipynb"):
        if not (NBS / dst.name).exists(): dst.unlink()
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


def execute(nb_path, skip_flags=SKIP_FLAGS):
    "Run one staged notebook in place with nbdev's test runner; True when every cell ran."
    import nbdev.test as nbt
    ok, _ = nbt.test_nb(Path(nb_path), skip_flags=list(skip_flags), basepath=str(ROOT), save=True)
    if ok: mark_executed(nb_path, skip_flags)
    return ok


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


def process():
    "nbdev's processing of the staged, executed notebooks into `_proc/`."
    from nbdev.quarto import refresh_quarto_yml, nbdev_sidebar
    from nbdev.serve import proc_nbs
    import nbdev.doclinks
    os.chdir(ROOT)
    refresh_quarto_yml()
    shutil.copy2(NBS / "nbdev.yml", STAGE / "nbdev.yml")
    nbdev.doclinks._build_modidx()
    nbdev_sidebar.__wrapped__(path=STAGE, force=True)
    shutil.rmtree(PROC, ignore_errors=True)
    proc_nbs(str(STAGE), n_workers=0, force=True)
    name_pages_like_quarto()
    return PROC


def name_pages_like_quarto():
    "Rename each processed notebook to its `output-file` (`00_viz.ipynb` → `viz.ipynb`), as Quarto names the pages."
    sidebar = PROC / "sidebar.yml"
    text = sidebar.read_text() if sidebar.exists() else ""
    for nb in PROC.glob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        front = "".join(cells[0]["source"]) if cells and cells[0]["cell_type"] == "raw" else ""
        out = next((l.split(":", 1)[1].strip() for l in front.splitlines() if l.startswith("output-file:")), None)
        if not out or out == nb.with_suffix(".html").name: continue
        target = nb.with_name(Path(out).with_suffix(".ipynb").name)
        nb.rename(target)
        text = text.replace(nb.name, target.name)
    if text: sidebar.write_text(text)


def render():
    "Render `_proc/` with smalldocs into `_docs/`, with local plotly.js and KaTeX."
    import smalldocs.layout, smalldocs.site
    shutil.copy2(plotly_js(), PROC / "plotly.min.js")
    katex = vendor_katex()
    smalldocs.layout.KATEX = "katex"   # pages sit at the site root; the default is a CDN
    shutil.rmtree(DOCS, ignore_errors=True)
    site = smalldocs.site.build(str(PROC), quiet=True)
    built = Path(site.out if hasattr(site, "out") else PROC / "_docs")
    if built.resolve() != DOCS.resolve():
        shutil.rmtree(DOCS, ignore_errors=True); shutil.move(str(built), str(DOCS))
    shutil.copytree(katex, DOCS / "katex", dirs_exist_ok=True)
    if not (DOCS / "plotly.min.js").exists(): shutil.copy2(plotly_js(), DOCS / "plotly.min.js")
    for w in getattr(site, "warnings", []): print(f"smalldocs warning: {w}", file=sys.stderr)
    return DOCS


class ChapterFailed(RuntimeError):
    "Some chapters failed to execute (a plain exception, so that a pytest fixture reports it as a failure)."


def build(skip_flags=SKIP_FLAGS, force=False, only_execute=False):
    "Stage, execute what is not fresh, process and render; returns the site folder."
    stage(force=force)
    failed = []
    for nb in chapters(STAGE):
        if is_executed(nb) and not force: print(f"fresh  {nb.name}"); continue
        print(f"run    {nb.name}", flush=True)
        if not execute(nb, skip_flags): failed.append(nb.name)
    if failed: raise ChapterFailed(f"build_docs: these chapters failed to execute: {failed}")
    if only_execute: return STAGE
    process()
    return render()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flags", default="", help="cell flags to run, e.g. 'slow gpu' (default: skip them)")
    ap.add_argument("--force", action="store_true", help="re-execute every chapter")
    a = ap.parse_args()
    run = set(a.flags.split())
    try: print(build(skip_flags=[f for f in SKIP_FLAGS if f not in run], force=a.force))
    except ChapterFailed as e: raise SystemExit(str(e)) from None
