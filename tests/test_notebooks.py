"""Every chapter runs as a pytest test (one per notebook), so a failure names the chapter.

Cells tagged `#| slow` or `#| gpu` are skipped unless NBDEV_FLAGS names them, e.g. NBDEV_FLAGS="slow gpu".
"""
import os
from pathlib import Path

import pytest
import nbdev.test as nbt

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if not p.name.startswith("_"))
SKIP_FLAGS = ["slow", "gpu"]


def _flags():
    "Flags to skip: those in `tst_flags` minus the ones NBDEV_FLAGS asks to run."
    run = set(os.environ.get("NBDEV_FLAGS", "").split())
    return [f for f in SKIP_FLAGS if f not in run]


def test_there_are_chapters():
    assert len(NOTEBOOKS) >= 2, f"expected the book's chapters in {ROOT/'nbs'}, found {NOTEBOOKS}"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook(nb):
    ok, elapsed = nbt.test_nb(nb, skip_flags=_flags(), basepath=str(ROOT))
    assert ok, f"{nb.name} failed (its traceback is printed above)"
