"""An arm's seeds trained as one batched ensemble (issue 25): each seed as if trained alone, reproducible, per-seed results."""
import json, sys
from pathlib import Path

import pandas as pd
import pytest

from spline_transformers.core import cpu_model
from spline_transformers.experiments import EXPERIMENTS, cells
from spline_transformers.runner import batch_key, reproduce, run_cells

sys.path.insert(0, str(Path(__file__).parent))
from tiny_experiment import NAME, tiny  # noqa: E402,F401  (tiny: the fixture)


@pytest.fixture(scope="module")
def phase1_done(tiny, tmp_path_factory):
    "A `.cells` folder with the tiny experiment's Phase I cell done (its learned arm needs it)."
    root = tmp_path_factory.mktemp("cells")
    run_cells([c for c in cells(tiny, "smoke") if c.spec["kind"] == "phase1"], root)
    return root


def _metrics(root, c): return pd.read_csv(root / c.key / "metrics.csv")


@pytest.mark.parametrize("arm", ["standard", "learned"])
def test_a_batched_seed_equals_the_seed_trained_alone(tiny, phase1_done, tmp_path, arm):
    "Both seeds of an arm in one ensemble, and each alone: the same metrics within 1e-5 (the same init and data order)."
    group = [c for c in cells(tiny, "smoke") if c.label.startswith(f"{NAME}/{arm}/")]
    assert len(group) == 2 and len({batch_key(c) for c in group}) == 1
    batched, alone = tmp_path / "batched", tmp_path / "alone"
    for root in (batched, alone):
        for p in phase1_done.iterdir(): (root / p.name).parent.mkdir(parents=True, exist_ok=True); (root / p.name).symlink_to(p)
    done = run_cells(group, batched)
    assert [d["batch"] for d in done] == [[c.label for c in group]] * 2 and all(d["batch_wall_s"] > 0 for d in done)
    for c in group:
        run_cells([c], alone)
        a, b = _metrics(batched, c), _metrics(alone, c)
        assert set(a.seed) == {c.spec["seed"]} and a[["step", "split", "metric"]].equals(b[["step", "split", "metric"]])
        assert (a.value - b.value).abs().max() <= 1e-5, (a.value - b.value).abs().max()


def test_a_batched_arm_is_bitwise_reproducible(tiny, tmp_path):
    "The same batch twice: every cell's metrics.csv is byte for byte the same."
    group = [c for c in cells(tiny, "smoke") if c.label.startswith(f"{NAME}/standard/")]
    run_cells(group, tmp_path / "a"); run_cells(group, tmp_path / "b")
    for c in group: assert (tmp_path / "a" / c.key / "metrics.csv").read_bytes() == (tmp_path / "b" / c.key / "metrics.csv").read_bytes()


def test_cells_that_differ_in_more_than_the_seed_are_not_batched(tiny, tmp_path):
    cs = cells(tiny, "smoke")
    std = next(c for c in cs if "/standard/" in c.label); learned = next(c for c in cs if "/learned/" in c.label)
    with pytest.raises(ValueError, match="differ in more than their seed"): run_cells([std, learned], tmp_path)
    with pytest.raises(ValueError, match="named twice"): run_cells([std, std], tmp_path)


@pytest.mark.slow
def test_reproduce_batches_each_arm_and_keeps_per_seed_results(tiny, tmp_path):
    "`reproduce` trains each arm's seeds as one job (per-seed metrics, done.json naming the batch); --no-batch-seeds runs them alone."
    said = []
    res = reproduce(NAME, "smoke", jobs=2, out=tmp_path / "b", log=said.append)[NAME]
    assert any("standard/seeds 0, 1 done" in l for l in said) and any("learned/seeds 0, 1 done" in l for l in said), said
    root = tmp_path / "b" / ".cells"
    for c in cells(tiny, "smoke"):
        d = json.loads((root / c.key / "done.json").read_text())
        assert ("batch" in d) == (c.spec["kind"] == "train")
    prov = json.loads((tmp_path / "b" / NAME / "provenance.json").read_text())
    assert prov["batched_seeds"] is True and prov["cell_cpus"] == [cpu_model()]   # each done.json names its machine; the provenance lists them
    assert sorted(r["seed"] for r in res["per_seed"]) == [0, 0, 1, 1]
    said = []
    reproduce(NAME, "smoke", jobs=2, out=tmp_path / "l", log=said.append, batch_seeds=False)
    assert any("standard/seed0 done" in l for l in said) and not any("seeds 0, 1" in l for l in said)
    assert json.loads((tmp_path / "l" / NAME / "provenance.json").read_text())["batched_seeds"] is False
