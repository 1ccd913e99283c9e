"""Exact sequence interpolation: block counts, exactness on many datasets, the softmax temperature, validation, files.

The construction lives in nbs/20_interpolation.ipynb (module spline_transformers.interpolation)."""
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from spline_transformers.interpolation import (
    ConstructionError, DatasetFileError, ExactInterpolator, InterpolationDataError, SelfAttention, STAGES,
    build_interpolator, expected_blocks, hardmax_weights, hausdorff, interpolate_file, load_dataset_file,
    params_per_block, random_dataset, save_dataset_file, softmax_weights, tau_bound, toy_dataset, validate_dataset)

torch.set_num_threads(1)
REL = 1e-9  # accepted Hausdorff error relative to the data's scale (the requirement)


def scale_of(X, Y):
    return max([1.0] + [float(np.abs(a).max()) for a in list(X) + list(Y)])


def assert_exact(T, X, Y, bitwise=None):
    "Every sequence's distinct outputs equal its targets within REL * scale, and there are exactly m_j of them."
    s = scale_of(X, Y)
    for j, (x, y) in enumerate(zip(X, Y)):
        out = T(x)
        assert out.shape == x.shape and out.dtype == torch.float64
        pred = T.predict(x)
        assert len(pred) == len(y), f"sequence {j}: {len(pred)} distinct outputs for {len(y)} targets"
        err = hausdorff(pred, y)
        assert err <= REL * s, f"sequence {j}: Hausdorff {err:.2e} > {REL * s:.1e}"
        if bitwise if bitwise is not None else T.attention == "hardmax":
            assert len(torch.unique(out, dim=0)) == len(y), f"sequence {j}: collapsed tokens are not bitwise equal"


def pooled_family(sets, d=2, seed=0, m=1):
    "Sequences made of given index sets into one pool of points (shared tokens), targets of length m."
    rng = np.random.default_rng(seed)
    P = rng.standard_normal((max(max(s) for s in sets) + 1, d))
    X = [P[list(s)] for s in sets]
    Y = [rng.standard_normal((min(m, len(s)), d)) for s in sets]
    return X, Y


# ---------------------------------------------------------------------------------------------------------------
# structure: block counts, parameter counts, stages, independence of n_j

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(N=st.integers(1, 7), d=st.integers(2, 5), pool=st.sampled_from([None, 6, 9]), seed=st.integers(0, 10_000))
def test_hardmax_block_count_formula(N, d, pool, seed):
    X, Y = random_dataset(N, d, n=(1, 6), pool=pool, seed=seed)
    T = build_interpolator(X, Y)
    M = sum(map(len, Y))
    assert T.n_blocks == 2 * M + 2 * N + 1 == expected_blocks(Y, "hardmax")
    assert T.n_params == T.n_blocks * params_per_block(d) == T.n_blocks * (10 * d + 8)
    S = T.info["n_separation"]
    assert S <= N - 1
    Tc = build_interpolator(X, Y, mode="compact")
    assert Tc.n_blocks == S + 2 * M + 1 <= T.n_blocks
    assert_exact(T, X, Y); assert_exact(Tc, X, Y)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(N=st.integers(1, 6), d=st.integers(2, 4), pool=st.sampled_from([None, 7]), seed=st.integers(0, 10_000))
def test_softmax_block_count_formula(N, d, pool, seed):
    X, Y = random_dataset(N, d, n=(1, 6), pool=pool, seed=seed)
    T = build_interpolator(X, Y, attention="softmax")
    M = sum(map(len, Y))
    assert T.n_blocks == 2 * M + 3 * N == expected_blocks(Y, "softmax")
    Tc = build_interpolator(X, Y, attention="softmax", mode="compact")
    assert Tc.n_blocks == T.info["n_separation"] + 2 * M + N
    assert_exact(T, X, Y); assert_exact(Tc, X, Y)


def test_expected_blocks_examples():
    assert expected_blocks([1, 1, 2]) == 15 and expected_blocks([1, 1, 2], "softmax") == 17
    assert expected_blocks([np.zeros((3, 2))]) == 9
    with pytest.raises(ValueError, match="valid options"): expected_blocks([1], "sparsemax")


def test_layers_have_the_construction_shapes():
    X, Y = random_dataset(6, 3, n=(2, 6), pool=8, seed=3)
    for attention in ("hardmax", "softmax"):
        T = build_interpolator(X, Y, attention=attention)
        for blk in T.blocks:
            assert blk.ff.width <= 4 and blk.ff.U.shape == (4, 3) and blk.ff.W.shape == (3, 4)
            assert float(blk.ff.eta) in (0.0, 1.0)
            assert (float(blk.ff.eta) == 0.0) == (blk.stage == "snap")
            sa = blk.sa
            A = float(sa.gamma) * torch.eye(3, dtype=torch.float64) + torch.outer(sa.q, sa.k)
            assert torch.linalg.matrix_rank(A) <= 1 or torch.equal(A, torch.eye(3, dtype=torch.float64))
            assert blk.stage in STAGES and blk.ff.stage == blk.stage
        stages = [b.stage for b in T.blocks]
        assert stages == sorted(stages, key=STAGES.index), "stages out of order"
        counts = T.stage_counts()
        assert counts["separation"] == 2 * 6 and counts["leaders"] == counts["interpolation"] == sum(map(len, Y))
        assert counts.get("collapse", 0) == (1 if attention == "hardmax" else 0)
        assert counts.get("snap", 0) == (0 if attention == "hardmax" else 6)


def test_separation_not_needed_for_disjoint_inputs():
    X, Y = random_dataset(8, 3, n=(1, 5), seed=1)
    T = build_interpolator(X, Y)
    assert T.info["n_separation"] == 0
    assert all(b.padding for b in T.blocks if b.stage == "separation")


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_size_independent_of_input_lengths(attention):
    rng = np.random.default_rng(0)
    Y = [rng.standard_normal((m, 3)) for m in (1, 2, 3)]
    sizes = set()
    for n in (3, 10, 400) + ((10_000,) if attention == "hardmax" else (2_000,)):
        X = [rng.standard_normal((n, 3)) for _ in Y]
        T = build_interpolator(X, Y, attention=attention)   # verifies every sequence (Hausdorff, m_j outputs)
        sizes.add((T.n_blocks, T.n_params))
        assert T.info["hausdorff"].max() <= REL * scale_of(X, Y)
    assert sizes == {(expected_blocks(Y, attention), expected_blocks(Y, attention) * params_per_block(3))}


# ---------------------------------------------------------------------------------------------------------------
# exactness on many datasets

@pytest.mark.parametrize("N", [1, 2, 5, 10, 30])
@pytest.mark.parametrize("d", [2, 3, 5, 16, 64])
def test_exact_random_datasets(N, d):
    for pool, seed in ((None, N * d), (max(3, N // 2 + 3), N * d + 1)):
        X, Y = random_dataset(N, d, n=(1, 20) if N <= 10 else (1, 8), pool=pool, seed=seed)
        assert_exact(build_interpolator(X, Y), X, Y)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(N=st.integers(1, 8), d=st.integers(2, 6), pool=st.sampled_from([None, 4, 6, 10]),
       scale=st.sampled_from([1e-3, 1.0, 1e3]), seed=st.integers(0, 100_000))
def test_exact_hypothesis(N, d, pool, scale, seed):
    try: X, Y = random_dataset(N, d, n=(1, 8), pool=pool, scale=scale, seed=seed)
    except ValueError: return  # pool too small for N distinct sets
    assert_exact(build_interpolator(X, Y, seed=seed), X, Y)


@pytest.mark.parametrize("case", ["all_m_eq_n", "all_m_1", "n_1", "N_1_d_2"])
def test_edge_cases(case):
    rng = np.random.default_rng(7)
    if case == "all_m_eq_n": X = [rng.standard_normal((n, 3)) for n in (1, 4, 7)]; Y = [rng.standard_normal(x.shape) for x in X]
    if case == "all_m_1": X = [rng.standard_normal((n, 3)) for n in (1, 4, 7)]; Y = [rng.standard_normal((1, 3)) for _ in X]
    if case == "n_1": X = [rng.standard_normal((1, 2)) for _ in range(5)]; Y = [rng.standard_normal((1, 2)) for _ in X]
    if case == "N_1_d_2": X = [rng.standard_normal((9, 2))]; Y = [rng.standard_normal((4, 2))]
    for attention in ("hardmax", "softmax"):
        assert_exact(build_interpolator(X, Y, attention=attention), X, Y)


@pytest.mark.parametrize("family", ["nested_chain", "triangle", "hull_interior", "differ_by_one", "all_shared"])
def test_hard_separation_families(family):
    if family == "nested_chain": sets = [list(range(k)) for k in range(1, 9)]
    if family == "triangle": sets = [[0, 1], [1, 2], [0, 2]]
    if family == "differ_by_one": sets = [[0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 2]]
    if family == "all_shared": sets = [[a, b] for a in range(5) for b in range(a + 1, 5)]
    if family == "hull_interior":
        X = [np.array([[0., 0.], [2., 0.], [0., 2.]]), np.array([[0., 0.], [2., 0.], [0., 2.], [0.5, 0.5]])]
        Y = [np.array([[1., 1.]]), np.array([[1., 1.], [-1., 3.]])]
    else: X, Y = pooled_family(sets, d=2, m=2)
    T = build_interpolator(X, Y)
    assert T.info["n_separation"] <= len(X) - 1
    assert_exact(T, X, Y)
    assert_exact(build_interpolator(X, Y, attention="softmax"), X, Y)


def test_target_coincidences():
    rng = np.random.default_rng(2)
    X = [rng.standard_normal((4, 3)) for _ in range(4)]
    Y = [X[1][:2].copy(),              # targets equal to another sequence's input tokens
         X[1][1:3].copy(),             # targets equal to the sequence's own input tokens
         X[1][:2].copy(),              # the same target set as sequence 0
         np.array([X[3][0], X[0][0]])]
    assert_exact(build_interpolator(X, Y), X, Y)
    assert_exact(build_interpolator(X, Y, attention="softmax"), X, Y)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_scales_and_near_coincident_tokens(scale):
    rng = np.random.default_rng(5)
    base = rng.standard_normal((6, 4))
    unit = max(1.0, scale * np.abs(base).max())
    near = base[0] + 1e-6 * unit / scale * np.array([1., 0, 0, 0])  # 1e-6 * scale apart (in the tolerance's scale)
    X = [scale * np.vstack([base[:3], near]), scale * base[2:], scale * np.vstack([base[:1], base[4:]])]
    Y = [scale * rng.standard_normal((m, 4)) for m in (2, 1, 3)]
    assert np.linalg.norm(X[0][0] - X[0][3]) < 2e-6 * unit
    for attention in ("hardmax", "softmax"):
        assert_exact(build_interpolator(X, Y, attention=attention), X, Y)


def test_permutation_equivariance():
    X, Y = random_dataset(5, 3, n=(3, 8), pool=9, seed=11)
    T = build_interpolator(X, Y)
    perm = np.random.default_rng(0).permutation(len(X[2]))
    assert torch.equal(T(X[2][perm]), T(X[2])[perm])
    assert hausdorff(T.predict(X[2][perm]), Y[2]) <= REL


def test_determinism_and_seeds():
    X, Y = random_dataset(5, 3, n=(2, 6), pool=8, seed=4)
    a, b, c = build_interpolator(X, Y, seed=1), build_interpolator(X, Y, seed=1), build_interpolator(X, Y, seed=2)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
    assert_exact(c, X, Y)


def test_forward_many_matches_forward_and_batches():
    X, Y = random_dataset(4, 2, n=(2, 5), pool=7, seed=9)
    T = build_interpolator(X, Y)
    for x, o in zip(X, T.forward_many(X)): torch.testing.assert_close(o, T(x), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"shape \(n, 2\)"): T(np.zeros((3, 5)))


# ---------------------------------------------------------------------------------------------------------------
# softmax temperature

def _clustering_input_and_layer(T, x):
    "Input positions and module of the softmax clustering attention layer (last leaders block)."
    pos, labels = T.trajectory(x)
    i = next(i for i, b in enumerate(T.blocks) if b.sa.stage == "collapse")
    return torch.from_numpy(pos[2 * i + 1]), T.blocks[i].sa


def test_softmax_temperatures_around_the_bound():
    X, Y = random_dataset(4, 3, n=(3, 8), pool=9, seed=21)
    bound = tau_bound(X, Y)
    assert 0 < bound < math.inf
    for frac in (1 / 2, 1 / 10, 1e-3):
        T = build_interpolator(X, Y, attention="softmax", tau=frac * bound)
        assert T.tau == frac * bound
        assert_exact(T, X, Y)
        if frac == 1 / 2:  # the weights are genuinely soft before the snap blocks
            off = 0.0
            for x in X:
                z, sa = _clustering_input_and_layer(T, x)
                w = sa.weights(z, z)
                off = max(off, float((w.sum(1) - w.max(1).values).max()))
            assert off > 1e-12, off
    T = build_interpolator(X, Y, attention="softmax")   # tau=None picks below the bound
    assert T.tau < bound and T.info["tau_bound"] == bound
    with pytest.raises(ConstructionError, match="too large"):
        build_interpolator(X, Y, attention="softmax", tau=2 * bound)
    for big in (2 * bound, 50 * bound, 1e4 * bound):   # non-strict: succeeds exactly or raises, never a wrong model
        try: T = build_interpolator(X, Y, attention="softmax", tau=big, strict=False)
        except ConstructionError as e: assert "tau" in str(e)
        else: assert_exact(T, X, Y)


def test_softmax_tiny_temperature_no_nan():
    s = torch.tensor([[3.0, 1.0, 2.0]], dtype=torch.float64)
    w = softmax_weights(s, 1e-12)
    assert torch.isfinite(w).all() and torch.equal(w, hardmax_weights(s))
    torch.testing.assert_close(softmax_weights(s, 0.05), hardmax_weights(s), atol=1e-8, rtol=0)


def test_softmax_requires_temperature():
    with pytest.raises(ValueError, match="tau > 0"): SelfAttention(2, "softmax", None)
    X, Y = toy_dataset()
    with pytest.raises(ValueError, match="tau must be > 0"): build_interpolator(X, Y, attention="softmax", tau=-1.0)


# ---------------------------------------------------------------------------------------------------------------
# attention primitives and the three lemmas

def test_hardmax_ties_split_uniformly():
    pts = torch.tensor([[1., 0.], [2., 1.], [2., -1.], [0., 1.], [-1., 0.], [1.5, 0.5]], dtype=torch.float64)
    w = hardmax_weights(pts[:1] @ pts.T)
    assert w[0].tolist() == [0, .5, .5, 0, 0, 0]
    w = hardmax_weights(torch.zeros(2, 4, dtype=torch.float64))
    assert torch.equal(w, torch.full((2, 4), 0.25, dtype=torch.float64))


def test_lemmas():
    v = torch.tensor([0.6, 0.8], dtype=torch.float64)
    X = torch.randn(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = SelfAttention(2, gamma=0., q=v, k=v, alpha=1., rho=0.)(X)
    proj = X @ v
    hi, lo = X[proj.argmax()], X[proj.argmin()]
    for x, o in zip(X, out): assert torch.equal(o, hi if x @ v > 0 else lo)                 # Lemma A
    box = 1 + torch.rand(20, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    box[7] = 2.5
    assert torch.equal(SelfAttention(3, gamma=1., alpha=1., rho=0.)(box), box[7].expand(20, 3))  # Lemma B
    ang = torch.linspace(0.1, 1.4, 6, dtype=torch.float64)
    sph = -3 * torch.stack([torch.cos(ang), torch.sin(ang)], 1)
    assert torch.equal(SelfAttention(2, gamma=1., alpha=1., rho=0.)(sph), sph)               # Lemma C


# ---------------------------------------------------------------------------------------------------------------
# validation errors

def _ok():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((4, 3)), rng.standard_normal((3, 3))], [rng.standard_normal((2, 3)), rng.standard_normal((1, 3))]


@pytest.mark.parametrize("case,match", [
    ("d1", "d must be >= 2"),
    ("m0", "sequence 1: target has no tokens"),
    ("m_gt_n", "sequence 1: m_j must satisfy 1 <= m_j <= n_j"),
    ("repeated_input", "sequence 0: repeated input tokens 1 and 3"),
    ("repeated_target", "sequence 0: repeated target tokens 0 and 1"),
    ("same_set", "sequences 0 and 1 have the same token set"),
    ("permutation", "sequences 0 and 2 have the same token set"),
    ("nan", "sequence 1: input token 2 has non-finite values"),
    ("inf_target", "sequence 0: target token 1 has non-finite values"),
    ("dims", "sequence 1: input tokens have dimension 4"),
    ("target_dims", "sequence 0: target tokens have dimension 2"),
    ("N0", "N = 0"),
    ("count", "2 input sequences but 3 target sequences"),
    ("not_2d", "sequence 0: input must be a 2-D array"),
    ("strings", "sequence 0: input is not an array of numbers"),
])
def test_validation_errors(case, match):
    X, Y = _ok()
    if case == "d1": X, Y = [x[:, :1] for x in X], [y[:, :1] for y in Y]
    if case == "m0": Y[1] = np.zeros((0, 3))
    if case == "m_gt_n": Y[1] = np.arange(12.).reshape(4, 3)
    if case == "repeated_input": X[0][3] = X[0][1] + 1e-12
    if case == "repeated_target": Y[0][1] = Y[0][0]
    if case == "same_set": X[1] = X[0][::-1].copy(); Y[1] = Y[0][:1]
    if case == "permutation": X.append(X[0][[2, 0, 3, 1]]); Y.append(Y[1])
    if case == "nan": X[1][2, 1] = np.nan
    if case == "inf_target": Y[0][1, 0] = np.inf
    if case == "dims": X[1] = np.zeros((3, 4))
    if case == "target_dims": Y[0] = Y[0][:, :2]
    if case == "N0": X, Y = [], []
    if case == "count": Y.append(Y[0])
    if case == "not_2d": X[0] = X[0][0]
    if case == "strings": X[0] = [["a", "b", "c"]]
    with pytest.raises(InterpolationDataError, match=match):
        build_interpolator(X, Y)
    with pytest.raises(ValueError):   # InterpolationDataError is a ValueError
        validate_dataset(X, Y)


def test_bad_options():
    X, Y = _ok()
    with pytest.raises(ValueError, match="'hardmax', 'softmax'"): build_interpolator(X, Y, attention="relu")
    with pytest.raises(ValueError, match="'paper', 'compact'"): build_interpolator(X, Y, mode="short")


# ---------------------------------------------------------------------------------------------------------------
# trajectories and predict

def test_trajectory_and_predict():
    X, Y = toy_dataset()
    T = build_interpolator(X, Y, attention="softmax")
    pos, labels = T.trajectory(X[0])
    assert isinstance(pos, np.ndarray) and pos.shape == (2 * T.n_blocks + 1, 5, 2)
    assert labels[0] == "input" and set(labels[1:]) <= set(STAGES) and len(labels) == len(pos)
    assert [l for _, _, l in T.layer_labels()] == labels[1:]
    np.testing.assert_array_equal(pos[0], X[0])
    np.testing.assert_array_equal(pos[-1], T(X[0]).numpy())
    pos_b, lab_b = T.trajectory(X[0], per="block")
    assert pos_b.shape[0] == T.n_blocks + 1 and lab_b[1:] == [b.stage for b in T.blocks]
    np.testing.assert_array_equal(pos_b[-1], pos[-1])
    with pytest.raises(ValueError, match="'layer', 'block'"): T.trajectory(X[0], per="frame")
    p = T.predict(X[2])
    assert isinstance(p, torch.Tensor) and p.shape == (2, 2)


def test_hausdorff():
    assert hausdorff([[0., 0.], [3., 4.]], [[0., 0.]]) == 5.0
    assert hausdorff(np.zeros((1, 2)), torch.zeros(3, 2, dtype=torch.float64)) == 0.0
    with pytest.raises(ValueError, match="non-empty"): hausdorff(np.zeros((0, 2)), np.zeros((1, 2)))


# ---------------------------------------------------------------------------------------------------------------
# dataset files and interpolate_file (the function behind `spline-transformers interpolate`)

@pytest.mark.parametrize("ext", [".npz", ".json"])
def test_dataset_files_round_trip(tmp_path, ext):
    X, Y = random_dataset(6, 3, n=(2, 7), pool=10, seed=8)
    f = save_dataset_file(tmp_path / f"data{ext}", X, Y)
    X2, Y2 = load_dataset_file(f)
    assert all(np.array_equal(a, b) for a, b in zip(X + Y, X2 + Y2)) and len(X2) == 6
    for attention in ("hardmax", "softmax"):
        r = interpolate_file(f, attention=attention)
        assert r["n_blocks"] == r["expected_blocks"] == expected_blocks(Y, attention)
        assert r["n_params"] == r["n_blocks"] * params_per_block(3)
        assert r["worst_hausdorff"] <= REL and r["n_sequences"] == 6 and r["d"] == 3
        json.dumps(r)  # printable / serialisable by the CLI


def test_npz_equal_length_form_and_json_aliases(tmp_path):
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((3, 5, 2)), rng.standard_normal((3, 2, 2))
    np.savez(tmp_path / "eq.npz", X=X, Y=Y)
    r = interpolate_file(tmp_path / "eq.npz")
    assert r["n_blocks"] == 2 * 6 + 2 * 3 + 1 and r["total_input_tokens"] == 15
    (tmp_path / "alias.json").write_text(json.dumps({"X": X.tolist(), "Y": Y.tolist()}))
    assert interpolate_file(tmp_path / "alias.json", mode="compact")["n_blocks"] == 2 * 6 + 1


@pytest.mark.parametrize("case,match", [
    ("missing", "no such file"),
    ("ext", "unknown dataset format '.csv'"),
    ("bad_json", "not valid JSON"),
    ("json_list", "expected a JSON object"),
    ("json_keys", "needs keys 'inputs' and 'targets'"),
    ("json_ragged_token", "is not a list of equal-length lists of numbers"),
    ("json_flat", "must be a list of tokens"),
    ("npz_keys", "needs arrays 'X' and 'Y'"),
    ("npz_lengths", "'X_lengths' sums to"),
    ("npz_2d", "add 'X_lengths'"),
    ("npz_garbage", "not a readable .npz file"),
    ("npz_object", "must hold numbers"),
])
def test_dataset_file_errors(tmp_path, case, match):
    f = tmp_path / {"ext": "d.csv", "bad_json": "d.json", "json_list": "d.json", "json_keys": "d.json",
                    "json_ragged_token": "d.json", "json_flat": "d.json"}.get(case, "d.npz")
    if case == "ext": f.write_text("1,2\n")
    if case == "bad_json": f.write_text("{inputs: [")
    if case == "json_list": f.write_text("[1, 2]")
    if case == "json_keys": f.write_text(json.dumps({"inputs": []}))
    if case == "json_ragged_token": f.write_text(json.dumps({"inputs": [[[1, 2], [3]]], "targets": [[[1, 2]]]}))
    if case == "json_flat": f.write_text(json.dumps({"inputs": [[1, 2]], "targets": [[[1, 2]]]}))
    if case == "npz_keys": np.savez(f, A=np.zeros(3))
    if case == "npz_lengths": np.savez(f, X=np.zeros((5, 2)), X_lengths=[2, 2], Y=np.zeros((1, 1, 2)))
    if case == "npz_2d": np.savez(f, X=np.zeros((5, 2)), Y=np.zeros((1, 1, 2)))
    if case == "npz_garbage": f.write_bytes(b"not a zip file")
    if case == "npz_object": np.savez(f, X=np.array([np.zeros((2, 2)), np.zeros((3, 2))], dtype=object), Y=np.zeros((2, 1, 2)))
    with pytest.raises(DatasetFileError, match=match):
        interpolate_file(f)


def test_interpolate_file_reports_data_errors(tmp_path):
    X, Y = _ok()
    Y[0] = np.vstack([Y[0][:1], Y[0][:1]])
    f = save_dataset_file(tmp_path / "bad.json", X, Y)
    with pytest.raises(InterpolationDataError, match="sequence 0: repeated target tokens"):
        interpolate_file(f)
