"Mechanics of the ground floor that need other processes: first-use compile notices and per-environment kernel builds."
import re, subprocess, sys, textwrap, uuid
from pathlib import Path

import pytest

from spline_transformers import core


def test_extension_name_tells_environments_apart(monkeypatch):
    "Two environments (interpreters or torch installs) never share a build folder, so neither rebuilds over the other."
    a = core.cpp_extension_name("k_", "int f() { return 1; }")
    assert core.cpp_extension_name("k_", "int f() { return 1; }") == a                    # same everything: same build
    assert core.cpp_extension_name("k_", "int f() { return 2; }") != a                    # source
    assert core.cpp_extension_name("k_", "int f() { return 1; }", ["-O2"]) != a           # flags
    monkeypatch.setattr(sys, "prefix", "/other/venv")
    assert core.cpp_extension_name("k_", "int f() { return 1; }") != a                    # another environment


def test_extension_name_ignores_the_interpreters_path(monkeypatch, tmp_path):
    "One environment started as `python`, `python3` or by an absolute path builds its kernels once (one name, one cache)."
    from pathlib import Path
    a = core.cpp_extension_name("k_", "int f() { return 1; }")
    for name in ("python", "python3"):
        monkeypatch.setattr(sys, "executable", str(Path(sys.prefix) / "bin" / name))
        assert core.cpp_extension_name("k_", "int f() { return 1; }") == a, name
    # real interpreters: two links with different names to the one binary
    monkeypatch.undo()
    code = "import sys; from spline_transformers.core import cpp_extension_name; print(sys.executable, cpp_extension_name('k_', 'int f() { return 1; }'))"
    seen = {}
    for name in ("python", "python3"):
        (tmp_path / name).symlink_to(Path(sys.executable).resolve())
        r = subprocess.run([str(tmp_path / name), "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        exe, key = r.stdout.split()
        seen[exe] = key
    assert len(seen) == 2 and len(set(seen.values())) == 1, seen
    assert set(seen.values()) == {a}, (seen, a)


def _build_in_fresh_process(source:str, timeout:float=600)->subprocess.CompletedProcess:
    "`build_cpp_extension` of `source` in a fresh interpreter, without torch's headers (pybind11's only: seconds, not a minute, to compile)."
    code = textwrap.dedent(f"""
        import functools
        from torch.utils import cpp_extension
        cpp_extension.load_inline = functools.partial(cpp_extension.load_inline, no_implicit_headers=True, with_pytorch_error_handling=False)
        from spline_transformers.core import build_cpp_extension
        m, why = build_cpp_extension("test_notice_", {source!r}, ["f"])
        assert m is not None, why
        print(m.f())
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_first_compile_is_announced_and_a_cached_one_is_silent():
    "The first build says it is compiling and how long it took; the next process loads the cached build in silence, and a killed one's lock does not hang the next."
    from torch.utils import cpp_extension
    if not cpp_extension.is_ninja_available(): pytest.skip("ninja is not installed")
    source = f"#include <pybind11/pybind11.h>\nint f() {{ return 7; }} // {uuid.uuid4().hex}"
    first = _build_in_fresh_process(source)
    assert first.returncode == 0, first.stderr
    assert "compiling the C++ kernel test_notice_" in first.stderr and "compiled test_notice_" in first.stderr
    second = _build_in_fresh_process(source)
    assert second.returncode == 0 and second.stdout.strip() == "7"
    assert "compil" not in second.stderr, second.stderr
    # A process killed while it built or loaded leaves torch's `lock` file, on which torch's next load waits forever.
    name = re.search(r"compiled (test_notice_\w+)", first.stderr)[1]
    stale = Path(cpp_extension._get_build_directory(name, False)) / "lock"
    stale.touch()
    third = _build_in_fresh_process(source, timeout=120)
    assert third.returncode == 0 and third.stdout.strip() == "7", third.stderr
    assert "removed the lock a killed build left" in third.stderr and not stale.exists(), third.stderr


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


@pytest.mark.slow
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


# ---- issue 29: locks, temporary names and permissions --------------------------------------------------------------

import contextlib, json, multiprocessing, os, socket, stat, threading, time
from pathlib import Path

from spline_transformers.core import FolderInUse, FolderLock, atomic_write, remove_stale_temps

_FORK = multiprocessing.get_context("fork")   # forked children start at once (no torch import); they only touch files


def _contend(folder:str, n:int, start, out):
    "Try `n` times to take the lock; inside it, create a probe file exclusively: a second holder would find it there."
    probe, got, overlaps, busy = os.path.join(folder, "probe"), 0, 0, 0
    start.wait()
    for _ in range(n):
        lock = FolderLock(folder, "test folder")
        try: lock.acquire()
        except FolderInUse: busy += 1; continue
        try:
            got += 1
            try: os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError: overlaps += 1; continue   # another process holds the lock too
            os.unlink(probe)
        finally: lock.release()
    out.put((got, overlaps, busy))


def test_folder_lock_never_has_two_holders(tmp_path):
    "Three processes take and give back one folder's lock thousands of times: never two holders at once (a fresh, still empty lock file is not stale)."
    n, k = 1500, 3
    start, out = _FORK.Event(), _FORK.Queue()
    procs = [_FORK.Process(target=_contend, args=(str(tmp_path), n, start, out)) for _ in range(k)]
    for p in procs: p.start()
    start.set()
    res = [out.get(timeout=120) for _ in procs]
    for p in procs: p.join(timeout=60)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    got, overlaps, busy = (sum(r[i] for r in res) for i in range(3))
    assert got + busy == n * k and got > 0, res
    assert overlaps == 0, f"{overlaps} of {got} acquisitions had a second holder: {res}"


def _hold(folder:str, ready, stop):
    lock = FolderLock(folder, "checkpoint folder").acquire()
    ready.set(); stop.wait(60)
    lock.release()


@contextlib.contextmanager
def _held_elsewhere(folder):
    "A forked process holding `folder`'s lock for the block: yields it and the event that makes it let go; killed at the end (no release runs)."
    ready, stop = _FORK.Event(), _FORK.Event()
    p = _FORK.Process(target=_hold, args=(str(folder), ready, stop)); p.start()
    try:
        assert ready.wait(30)
        yield p, stop
    finally:
        p.kill(); p.join(30)


def test_a_held_lock_names_its_holder_and_dies_with_it(tmp_path):
    "A second process is refused in one line naming the holder (no advice to delete the lock); once the holder is killed, the lock is free."
    with _held_elsewhere(tmp_path) as (p, _):
        with pytest.raises(FolderInUse) as e: FolderLock(tmp_path, "checkpoint folder").acquire()
        msg = str(e.value)
        assert f"checkpoint folder {tmp_path} is in use by process {p.pid} on {socket.gethostname()}" in msg, msg
        assert "\n" not in msg and "delete" not in msg.lower(), msg
    with FolderLock(tmp_path, "checkpoint folder") as lock: assert lock.held   # the kernel let go of its lock


def test_acquire_waits_for_the_holder_when_asked(tmp_path):
    "`acquire(wait=...)` takes the lock once the holder lets go; a wait shorter than the hold ends in `FolderInUse`, after the wait."
    with _held_elsewhere(tmp_path) as (p, stop):
        t0 = time.monotonic()
        with pytest.raises(FolderInUse, match="is in use by process"): FolderLock(tmp_path).acquire(wait=0.3)
        assert time.monotonic() - t0 >= 0.3
        threading.Timer(0.5, stop.set).start()   # the holder lets go in half a second
        t0 = time.monotonic()
        with FolderLock(tmp_path).acquire(wait=30) as lock: assert lock.held and time.monotonic() - t0 >= 0.4
    with pytest.raises(ValueError, match="wait must be >= 0"): FolderLock(tmp_path).acquire(wait=-1)


def _try_once(folder:str, out):
    try: FolderLock(folder).acquire(); out.put("got it")
    except FolderInUse: out.put("in use")


def _other_process_gets(folder) -> str:
    out = _FORK.Queue()
    p = _FORK.Process(target=_try_once, args=(str(folder), out)); p.start()
    r = out.get(timeout=30); p.join(30)
    return r


def test_folder_lock_is_reentrant_and_counts(tmp_path):
    "A second FolderLock on the same folder in the same process succeeds; giving it back leaves the first one held."
    outer = FolderLock(tmp_path).acquire()
    inner = FolderLock(tmp_path).acquire()
    assert inner.held
    inner.release()
    assert not inner.held and outer.held
    assert _other_process_gets(tmp_path) == "in use"
    outer.release()
    assert _other_process_gets(tmp_path) == "got it"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"]); p.wait()
    return p.pid


def test_stale_temps_are_only_the_packages_own(tmp_path):
    "Only `.<target>.tmp-<pid>-<8 random characters>` of dead writers go; with names=, only those targets'; user files and folders stay."
    dead = _dead_pid()
    ours_file = tmp_path / f".x.json.tmp-{dead}-ab_cd123"; ours_file.write_bytes(b"half")
    ours_dir = tmp_path / f".corpus.tmp-{dead}-k3j4h5g6"; ours_dir.mkdir(); (ours_dir / "train.bin").write_bytes(b"half")
    keep = [tmp_path / f".thesis.tex.tmp-{dead}-draft", tmp_path / f".notes.tmp-{dead}", tmp_path / f".a.tmp-{dead}-abc",
            tmp_path / f".b.tmp-{dead}-ABCDEFGH", tmp_path / f"c.tmp-{dead}-abcdefgh", tmp_path / f".d.tmp-{dead}-abcdefghi"]
    for p in keep: p.write_text("mine")
    user_dir = tmp_path / f".results.tmp-{dead}-x"; user_dir.mkdir(); (user_dir / "table.csv").write_text("mine")
    other_dir = tmp_path / f".other.tmp-{dead}-abcdefgh"; other_dir.mkdir(); (other_dir / "f").write_text("someone's")
    # the folder above a prepared corpus: only that target's temporary folder goes
    assert remove_stale_temps(tmp_path, names=["corpus"]) == [ours_dir]
    assert ours_file.exists() and other_dir.exists()
    # a folder the package owns: its temporary files go, folders only for named targets
    assert remove_stale_temps(tmp_path) == [ours_file]
    assert other_dir.exists() and user_dir.exists() and all(p.exists() for p in keep)


@contextlib.contextmanager
def umask(mask:int):
    old = os.umask(mask)
    try: yield
    finally: os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_written_files_and_folders_follow_the_umask(tmp_path, mask):
    "atomic_write and the package's temporary folders give 0o666 / 0o777 less the umask, like any other program (not 0600 / 0700)."
    with umask(mask):
        f = atomic_write(tmp_path / "sub" / "report.json", "{}")
        d = core.temp_folder(tmp_path, "corpus")
    assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE(f.parent.stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE(d.stat().st_mode) == 0o777 & ~mask
    assert d.name.startswith(f".corpus.tmp-{os.getpid()}-") and remove_stale_temps(tmp_path, names=["corpus"]) == []   # alive: kept


# ---- issue 24: one process runner (`ChildProcess`) ------------------------------------------------------------------

import signal, tempfile, time

from spline_transformers.core import ChildProcess


def _threads(pid:int)->int:
    try: return int(next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("Threads:")).split()[1])
    except (OSError, StopIteration): return 0


def _alive(pid:int)->bool:
    "A live process (not a zombie waiting for its reaper)."
    try: return "Z" not in next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("State:"))
    except (OSError, StopIteration): return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_child_dies_with_its_parent(sig):
    "kill -9 or kill -TERM a parent whose child is running its call: the child ends too (parent-death signal, watchdog)."
    code = ("import sys, time; from spline_transformers.core import ChildProcess; "
            "p = ChildProcess('time:sleep').send(120); print(p.pid, flush=True); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        deadline = time.time() + 60
        while time.time() < deadline and _threads(child) < 2: time.sleep(0.1)   # its watchdog thread: bound to the parent
        assert _alive(child) and _threads(child) >= 2, "the child did not start"
        assert "time:sleep" in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")   # `ps` shows what it runs
        parent.send_signal(sig); parent.wait(30)
        deadline = time.time() + 15
        while time.time() < deadline and _alive(child): time.sleep(0.1)
        assert not _alive(child), "the child outlived its parent"
    finally:
        if parent.poll() is None: parent.kill(); parent.wait()


def test_child_process_mechanics(tmp_path):
    "Threads, a death without an answer (named, with its log's end and path), stop before the call, JSON-only arguments, temporary files removed."
    log = tmp_path / "exit.log"
    one, two, dies, idle = (ChildProcess("torch:get_num_threads"), ChildProcess("torch:get_num_threads", threads=2),
                            ChildProcess("os:_exit", log=log, name="the exiting child"), ChildProcess("time:sleep"))
    folders = [p.folder for p in (one, two, dies, idle)]
    assert all(f.is_dir() and f.name.startswith(".spline_transformers_child.tmp-") for f in folders)
    assert (one.send().result(), two.send().result()) == (1, 2)
    with pytest.raises(RuntimeError, match=r"the exiting child ended with exit code 3 and no result.*its log: .*exit\.log"): dies.send(3).result()
    assert log.is_file()   # a log the caller named stays
    with pytest.raises(TypeError): idle.send(object())   # not JSON: refused here, before the child sees it
    idle.stop()
    assert idle.poll() is not None and not any(f.exists() for f in folders)
    with pytest.raises(RuntimeError, match="sent already"): one.send()
    with pytest.raises(ValueError, match="threads"): ChildProcess("time:sleep", threads=0)


@pytest.mark.slow
def test_a_warm_child_is_a_fresh_child_without_the_imports(tmp_path, monkeypatch):
    """Forked from the warm starter or started as a fresh interpreter, a child has the environment it was given and a runner's cell
    trains to the same bits; only the warm one is not this process's own child (the starter forked it)."""
    import threading
    from spline_transformers.experiments import cells
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_experiment import tiny_experiment
    cell = next(c for c in cells(tiny_experiment(), "smoke") if "/standard/" in c.label)
    env, bits = {"SPLINE_TRANSFORMERS_THREADS": "1"}, {}   # one environment: one starter
    for warm in ("0", "1"):
        monkeypatch.setenv("SPLINE_TRANSFORMERS_WARM_START", warm)
        root = tmp_path / f"warm{warm}"; (root / cell.key).mkdir(parents=True)
        p = ChildProcess("spline_transformers.runner:cell_main", env=env)
        assert (p.warm is not None) == (warm == "1")
        p.send([{"key": cell.key, "spec": cell.spec, "deps": [], "label": cell.label}], str(root), "cpu").result()
        bits[warm] = (root / cell.key / "metrics.csv").read_bytes()
        assert (ChildProcess("os:getppid", env=env).send().result() == os.getpid()) == (warm == "0")
        assert ChildProcess("os:getenv", env=env).send("SPLINE_TRANSFORMERS_THREADS").result() == "1"
    assert bits["0"] == bits["1"]
    # a child asked for by a thread that then ends (nbdev runs a chapter's cells in one) is warm, and its starter outlives the
    # thread: it was forked by the package's spawner thread, to which Linux binds its parent-death signal
    env2, box = {**env, "SPLINE_TRANSFORMERS_TEST_THREAD": "1"}, []   # a new environment: a starter made for the thread
    t = threading.Thread(target=lambda: box.append(ChildProcess("os:getppid", env=env2))); t.start(); t.join()
    assert box[0].warm is not None
    time.sleep(1.0)   # the thread is gone
    later = ChildProcess("os:getppid", env=env2)
    assert later.warm is not None and later.warm[0] is box[0].warm[0], "the starter died with the thread that asked for it"
    assert box[0].send().result() == later.send().result() == later.warm[0].proc.pid   # both forked by that one starter
