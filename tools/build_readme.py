"""Write README.md from the front page, `nbs/index.ipynb` (markdown cells as they are, shown code as Python blocks).

    python tools/build_readme.py          # write README.md
    python tools/build_readme.py --check  # exit 1 if README.md is out of date
    python tools/build_readme.py --commands  # the README's install and test commands, one per line (what .ci/run runs)
"""
import json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INDEX, README = ROOT / "nbs" / "index.ipynb", ROOT / "README.md"
HEADER = "<!-- Generated from nbs/index.ipynb by tools/build_readme.py: edit the notebook, not this file. -->\n\n"


def _src(c): return "".join(c["source"]) if isinstance(c["source"], list) else c["source"]


def readme_text(index=INDEX):
    "The README's text for the front-page notebook `index`."
    parts = []
    for c in json.loads(Path(index).read_text())["cells"]:
        s = _src(c).strip()
        if not s: continue
        if c["cell_type"] == "markdown": parts.append(s)
        elif c["cell_type"] == "code":
            if re.match(r"#\|\s*(hide|export)", s): continue
            parts.append("```python\n" + "\n".join(l for l in s.splitlines() if not l.startswith("#|")) + "\n```")
    return HEADER + "\n\n".join(parts) + "\n"


DEMO = "spline-transformers demo"   # the full demo takes minutes; the tests run it as `demo --quick`


def commands(readme=README, ci=True):
    "The commands of the README's ```sh blocks, in order, `&&` chains split; with `ci`, without the full demo."
    out = []
    for block in re.findall(r"```sh\n(.*?)```", Path(readme).read_text(), re.S):
        for line in block.splitlines():
            out += [c.strip() for c in line.split("&&") if c.strip() and not c.strip().startswith("#")]
    return [c for c in out if not (ci and c.startswith(DEMO))]


if __name__ == "__main__":
    if "--commands" in sys.argv:
        print("\n".join(commands())); sys.exit(0)
    text = readme_text()
    if "--check" in sys.argv:
        ok = README.exists() and README.read_text() == text
        print("README.md is up to date" if ok else "README.md is stale: run python tools/build_readme.py")
        sys.exit(0 if ok else 1)
    README.write_text(text); print(f"wrote {README}")
