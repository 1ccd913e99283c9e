"""Every chapter runs as a pytest test (one per notebook), so a failure names the chapter.

Each notebook runs from a staged copy in `_build/nbs/` and is saved there with its outputs, which the docs build
(`tools/build_docs.py`) then reuses instead of executing the chapter a second time. Cells tagged `#| slow` or
`#| gpu` are skipped unless NBDEV_FLAGS names them, e.g. NBDEV_FLAGS="slow gpu".
"""
import os

import pytest

from conftest import build_docs

NOTEBOOKS = build_docs.chapters()
SKIP_FLAGS = build_docs.SKIP_FLAGS


def _skip_flags():
    "Flags to skip: `slow` and `gpu`, minus the ones NBDEV_FLAGS asks to run."
    run = set(os.environ.get("NBDEV_FLAGS", "").split())
    return [f for f in SKIP_FLAGS if f not in run]


@pytest.fixture(scope="module")
def staged():
    return build_docs.stage(force=True)


def test_there_are_chapters():
    assert len(NOTEBOOKS) >= 2, f"expected the book's chapters in {build_docs.NBS}, found {NOTEBOOKS}"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook(nb, staged):
    ok = build_docs.execute(staged / nb.name, _skip_flags())
    assert ok, f"{nb.name} failed (its traceback is printed above)"
