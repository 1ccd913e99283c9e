"Pilots (chapter 9f): the rule picks the first candidate whose share of seeds reaching the threshold is in range, counting every seed."
import pytest

from spline_transformers.calibration import PILOT_MANO, pilot_result, pilot_setting, pilot_headline, pilot_table, PILOT_SEEDS
from spline_transformers.experiments import EXPERIMENTS


def _outputs(setting, reached_per_candidate):
    "Cell outputs where candidate i has the given number of seeds reaching the threshold (the others never do)."
    out = []
    for c, k in zip(setting["candidates"], reached_per_candidate):
        ps = [{"seed": s, "steps": 500.0 if i < k else None, "reached": i < k, "final_test": 0.96 if i < k else 0.4, "final_ood": None}
              for i, s in enumerate(setting["seeds"])]
        out.append({"candidate": c["name"], "per_seed": ps, "curve": {"step": [0], "median_test": [0.0]}})
    return out


def test_the_rule_picks_the_first_candidate_in_range_and_counts_every_seed():
    s = PILOT_MANO.setting("cpu")
    n = len(s["seeds"])
    assert n == len(PILOT_SEEDS) == 8
    # 1/8 and 8/8 are out of range (0.5 to 0.9); 4/8 is the first in range, 6/8 after it is not picked
    r = pilot_result(s, _outputs(s, [1, 8, 4, 6]))
    assert [c["usable"] for c in r["candidates"]] == [False, False, True, True]
    assert r["chosen"] == "mod23"
    assert r["candidates"][2]["median_steps"] == 500.0   # the 4th of 8 sorted values: a reaching seed's steps
    assert r["candidates"][0]["median_steps"] is None     # most seeds never reach it: no finite median, and no seed dropped
    assert pilot_headline(r).startswith("chosen: mod23 (4/8")
    assert pilot_table(r).loc["mod23", "picked"] == "←"
    none = pilot_result(s, _outputs(s, [0, 0, 8, 8]))
    assert none["chosen"] is None and pilot_headline(none) == "no candidate qualifies: mod7 0/8, mod11 0/8, mod23 8/8, mod23_6000 8/8"


def test_a_pilot_refuses_seeds_the_experiment_uses_and_unknown_fields():
    first_phase1 = EXPERIMENTS["mano"].setting("cpu").phase1_runs[0].seeds[0]
    with pytest.raises(ValueError, match="pilot seeds must differ"): pilot_setting("mano", [dict(name="a")], seeds=(0, 2001))
    with pytest.raises(ValueError, match="pilot seeds must differ"): pilot_setting("mano", [dict(name="a")], seeds=(first_phase1,))
    with pytest.raises(ValueError, match="distinct names"): pilot_setting("mano", [dict(name="a"), dict(name="a")])
    with pytest.raises(ValueError, match="unknown keys"): pilot_setting("mano", [dict(name="a", model={})])
    with pytest.raises(ValueError, match="not architecture fields"): pilot_setting("mano", [dict(name="a", arch=dict(d_modle=128))])
    with pytest.raises(ValueError, match="not architecture fields"): pilot_setting("mano", [dict(name="a", arch=dict(attn_fn="spline"))])   # the standard arm stays standard
    assert pilot_setting("mano", [dict(name="a", arch=dict(d_model=128))])["candidates"][0]["arch"] == dict(d_model=128)
    with pytest.raises(ValueError, match="share must be"): pilot_setting("mano", [dict(name="a")], share=(0.9, 0.5))
