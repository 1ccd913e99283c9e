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


def _in_fresh_process(code:str, **env)->str:
    import os
    e = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, env=e)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


RSS_AFTER_FREE = """
    import spline_transformers, torch, os
    def rss(): return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    x = torch.ones(64 << 20, dtype=torch.uint8); x.add_(1); del x     # 64 MiB touched, then freed
    print(os.environ.get('OMP_WAIT_POLICY'), spline_transformers.core.MALLOC_TUNED, rss() >> 20)
"""


def test_importing_the_package_sets_up_the_process():
    "Importing the package makes OpenMP threads yield and keeps freed activations in the heap; SPLINE_TRANSFORMERS_PROCESS=default opts out."
    policy, tuned, rss_tuned = _in_fresh_process(RSS_AFTER_FREE).split()
    assert (policy, tuned) == ("PASSIVE", "True")
    policy, tuned, rss_default = _in_fresh_process(RSS_AFTER_FREE, SPLINE_TRANSFORMERS_PROCESS="default").split()
    assert (policy, tuned) == ("None", "False")
    assert int(rss_tuned) - int(rss_default) > 48, (rss_tuned, rss_default)   # the tuned heap kept the 64 MiB block
    assert _in_fresh_process("import spline_transformers, os; print(os.environ['OMP_WAIT_POLICY'])", OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"


def test_the_main_install_brings_what_the_fast_kernels_need():
    "`pip install -e .` (the README's main command) installs ninja, which the fused C++ kernels are built with."
    import tomllib
    from pathlib import Path
    meta = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert any(d.replace(" ", "").startswith("ninja") for d in meta["dependencies"]), meta["dependencies"]
