"""Author notebooks as percent-format Python and convert them both ways; check committed notebooks.

Usage:
  python tools/nbtool.py from-py SRC.py DST.ipynb   # `# %%` code cells, `# %% [markdown]` markdown cells
  python tools/nbtool.py to-py SRC.ipynb DST.py
  python tools/nbtool.py clear NB ...              # drop outputs and widget state
  python tools/nbtool.py check [NB ...]            # no outputs, no widget state, kernelspec, < 1 MB
"""
import hashlib, json, sys
from pathlib import Path

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
MAX_BYTES = 1_000_000

def _cell(kind, lines):
    while lines and not lines[-1].strip(): lines.pop()
    while lines and not lines[0].strip(): lines.pop(0)
    if kind == "markdown": lines = [l[2:] if l.startswith("# ") else l[1:] if l.startswith("#") else l for l in lines]
    src = "\n".join(lines)
    c = {"cell_type": kind, "metadata": {}, "source": src}
    if kind == "code": c.update(execution_count=None, outputs=[])
    return c

def from_py(src, dst):
    "Build `dst` notebook from percent-format `src`."
    cells, kind, buf = [], None, []
    for line in Path(src).read_text().splitlines():
        if line.startswith("# %%"):
            if kind is not None and any(l.strip() for l in buf): cells.append(_cell(kind, buf))
            kind, buf = ("markdown" if "[markdown]" in line or "[md]" in line else "code"), []
        else: buf.append(line)
    if kind is not None and any(l.strip() for l in buf): cells.append(_cell(kind, buf))
    for i, c in enumerate(cells):   # stable ids, so that nbdev-export and nbdev-clean agree from the start
        c["id"] = hashlib.sha1(f"{i}:{c['source']}".encode()).hexdigest()[:8]
    nb = {"cells": cells, "metadata": {"kernelspec": KERNELSPEC}, "nbformat": 4, "nbformat_minor": 5}
    Path(dst).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")

def to_py(src, dst):
    "Write notebook `src` as percent-format Python `dst`."
    out = []
    for c in json.loads(Path(src).read_text())["cells"]:
        s = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        if c["cell_type"] == "markdown": out += ["# %% [markdown]"] + [("# " + l).rstrip() for l in s.splitlines()]
        else: out += ["# %%"] + s.splitlines()
        out.append("")
    Path(dst).write_text("\n".join(out))

def problems(path):
    "What is wrong with committed notebook `path` (empty list if nothing)."
    p, errs = Path(path), []
    if p.stat().st_size > MAX_BYTES: errs.append(f"{p}: {p.stat().st_size:,} bytes, over the 1 MB limit")
    nb = json.loads(p.read_text())
    if "widgets" in nb.get("metadata", {}): errs.append(f"{p}: holds saved widget state (metadata.widgets)")
    n_out = sum(bool(c.get("outputs")) for c in nb["cells"] if c["cell_type"] == "code")
    if n_out: errs.append(f"{p}: {n_out} cells carry outputs; the site build executes notebooks, so commit them cleared "
                          f"(python tools/nbtool.py clear {p})")
    if "kernelspec" not in nb.get("metadata", {}): errs.append(f"{p}: no metadata.kernelspec (JupyterLab would ask for a kernel)")
    return errs

def clear(paths):
    "Drop outputs, execution counts and widget state from notebooks in place."
    for p in paths:
        nb = json.loads(Path(p).read_text())
        nb.get("metadata", {}).pop("widgets", None)
        for c in nb["cells"]:
            if c["cell_type"] == "code": c["outputs"], c["execution_count"] = [], None
        Path(p).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")

def check(paths):
    paths = paths or sorted(Path("nbs").glob("**/*.ipynb"))
    errs = [e for p in paths if ".ipynb_checkpoints" not in str(p) for e in problems(p)]
    print("\n".join(errs) or f"{len(paths)} notebooks OK")
    return 1 if errs else 0

if __name__ == "__main__":
    cmd, *args = sys.argv[1:] or ["-h"]
    if cmd == "from-py": from_py(*args)
    elif cmd == "to-py": to_py(*args)
    elif cmd == "clear": clear(args)
    elif cmd == "check": sys.exit(check(args))
    else: print(__doc__)
