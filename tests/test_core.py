"Mechanics of the ground floor that need other processes: first-use compile notices and per-environment kernel builds."
import subprocess, sys, textwrap, uuid

import pytest

from spline_transformers import core


def test_extension_name_tells_environments_apart(monkeypatch):
    "Two environments (interpreters or torch installs) never share a build folder, so neither rebuilds over the other."
    a = core.cpp_extension_name("k_", "int f() { return 1; }")
    assert core.cpp_extension_name("k_", "int f() { return 1; }") == a                    # same everything: same build
    assert core.cpp_extension_name("k_", "int f() { return 2; }") != a                    # source
    assert core.cpp_extension_name("k_", "int f() { return 1; }", ["-O2"]) != a           # flags
    monkeypatch.setattr(sys, "executable", "/other/venv/bin/python")
    assert core.cpp_extension_name("k_", "int f() { return 1; }") != a                    # another environment


def _build_in_fresh_process(source:str)->subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        from spline_transformers.core import build_cpp_extension
        m, why = build_cpp_extension("test_notice_", {source!r}, ["f"])
        assert m is not None, why
        print(m.f())
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


def test_a_first_compile_is_announced_and_a_cached_one_is_silent():
    "The first build says it is compiling and how long it took; the next process loads the cached build in silence."
    from torch.utils import cpp_extension
    if not cpp_extension.is_ninja_available(): pytest.skip("ninja is not installed")
    source = f"int f() {{ return 7; }} // {uuid.uuid4().hex}"
    first = _build_in_fresh_process(source)
    assert first.returncode == 0, first.stderr
    assert "compiling the C++ kernel test_notice_" in first.stderr and "compiled test_notice_" in first.stderr
    second = _build_in_fresh_process(source)
    assert second.returncode == 0 and second.stdout.strip() == "7"
    assert "compil" not in second.stderr, second.stderr
