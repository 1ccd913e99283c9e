"""README.md is generated from the front page and names the exact commands that CI and users run."""
import re
from pathlib import Path

from conftest import ROOT
import build_readme


def test_readme_is_generated_from_the_front_page():
    assert (ROOT / "README.md").read_text() == build_readme.readme_text(), "README.md is stale: run python tools/build_readme.py"


def test_readme_has_exactly_two_commands_and_ci_runs_the_test_one():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    assert len(blocks) == 2, blocks
    assert "spline-transformers demo" in blocks[0]
    test_cmd = blocks[1].strip().split("&&")[-1].strip()
    assert test_cmd in (ROOT / ".ci" / "run").read_text(), f"{test_cmd!r} is not what .ci/run runs"
