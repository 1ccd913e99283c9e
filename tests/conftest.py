import contextlib, fcntl, json, os, re, shlex, shutil, signal, subprocess, sys, time
from pathlib import Path

import pytest

# Tests never reach the Hugging Face hub; loaders must take the offline path.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Property tests are reproducible: the same examples on every run and machine (derandomize), nothing written into the
# checkout (no example database, so no failure is silently replayed from .hypothesis/), no timing flakiness.
# HYPOTHESIS_PROFILE=explore draws fresh random examples, for a local hunt for bugs.
from hypothesis import settings, HealthCheck  # noqa: E402

settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=50, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", database=None, deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The many short processes the tests start (experiment cells, CLI runs, torchrun ranks) import the package: let them
# reuse compiled bytecode (__pycache__/ is ignored by git) instead of compiling it again in every process.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import build_docs  # noqa: E402  (tools/ is not a package)

SMOKE_ENV = "SPLINE_TRANSFORMERS_SMOKE"   # chapters that show a smoke run read the session's one run from this folder
DEMO_ENV = "SPLINE_TRANSFORMERS_DEMO"     # chapters that show `demo --quick` read the session's one run from this folder
WORKER = os.environ.get("PYTEST_XDIST_WORKER")   # "gw0", "gw1", ... under pytest-xdist; None in a plain run


# ---------------------------------------------------------------- order: long shared runs start first, the site is built last
def needs_smoke(item)->bool:
    "Does this test read the session's smoke run (the `smoke_run` fixture, or a chapter that reads $SPLINE_TRANSFORMERS_SMOKE)?"
    if "smoke_run" in getattr(item, "fixturenames", ()): return True
    nb = _chapter(item)
    return nb is not None and _reads(nb, SMOKE_ENV)


def needs_demo(item)->bool:
    "Does this test read the session's `demo --quick` (the `demo_run` fixture, or a chapter that reads $SPLINE_TRANSFORMERS_DEMO)?"
    if "demo_run" in getattr(item, "fixturenames", ()): return True
    nb = _chapter(item)
    return nb is not None and _reads(nb, DEMO_ENV)


_texts = {}
def _reads(nb, name)->bool:
    "Does this notebook's text mention `name`?"
    if nb not in _texts: _texts[nb] = Path(nb).read_text()
    return name in _texts[nb]


def pytest_collection_modifyitems(config, items):
    """The docs-site tests run last (they reuse the chapters the notebook tests executed); the tests that read the smoke run
    come just before them, and those that read the quick demo before those, so that these runs (started in the background
    by the first test) are done when they are needed; the other chapters come before those, after every other test, so
    that while one worker drives JupyterLab (`quiet_cores`: no smoke reader and no site build beside it) the other still
    has chapters to run instead of waiting for the smoke lock. Under pytest-xdist (`--dist load`) tests are handed out in this order."""
    items.sort(key=lambda it: (it.get_closest_marker("docs") is not None, needs_smoke(it), needs_demo(it), _chapter(it) is not None))
    for it in items:
        if (_chapter(it) or needs_smoke(it) or needs_demo(it) or it.get_closest_marker("docs") or it.get_closest_marker("browser")
                or "browser" in getattr(it, "fixturenames", ())):
            it.add_marker(pytest.mark.slow)   # chapters, the shared runs' readers, the site and the browser: not in the inner loop


# ---------------------------------------------------------------- runs shared by the whole session (and every xdist worker)
def shared_dir(tmp_path_factory)->Path:
    "A folder every worker of this test run shares (the run's base temp folder)."
    base = tmp_path_factory.getbasetemp()
    return base.parent if WORKER else base


class Background:
    """A command run once per test session in the background, started by the first test of the first worker that needs
    it; any worker waits for its end. Its stdout, stderr and exit status are files in `folder`."""
    def __init__(self, folder:Path, cmd:list, env:dict=None):
        self.folder, self.cmd, self.env = Path(folder), [str(c) for c in cmd], env
        self.rc_file, self.pid_file = self.folder / "returncode", self.folder / "pid"

    def start(self):
        "Start the command unless a worker already did (an atomic mkdir decides)."
        try: self.folder.mkdir(parents=True)
        except FileExistsError: return False
        line = " ".join(shlex.quote(c) for c in self.cmd)
        q = lambda name: shlex.quote(str(self.folder / name))
        script = (f"{line} >{q('stdout')} 2>{q('stderr')}; rc=$?; times >{q('times')}; "   # `times`: the CPU seconds it used
                  f"echo $rc >{q('returncode.tmp')} && mv {q('returncode.tmp')} {q('returncode')}")
        p = subprocess.Popen(["bash", "-c", script], cwd=self.folder, start_new_session=True, stdin=subprocess.DEVNULL,
                             env={**os.environ, **(self.env or {})})
        self.pid_file.write_text(str(p.pid))
        self._proc = p
        return True

    def wait(self, timeout=1800)->subprocess.CompletedProcess:
        "Wait for the command (starting it if no one has); its CompletedProcess."
        self.start()
        t0 = time.time()
        while not self.rc_file.exists():
            if time.time() - t0 > timeout: raise TimeoutError(f"{' '.join(self.cmd)} did not finish in {timeout} s")
            time.sleep(0.5)
        return subprocess.CompletedProcess(self.cmd, int(self.rc_file.read_text()), (self.folder / "stdout").read_text(),
                                           (self.folder / "stderr").read_text())

    def cpu_s(self)->float:
        "CPU seconds (user + system) the finished command and its processes used, from bash's `times`."
        f = self.folder / "times"
        if not f.is_file(): return float("nan")
        secs = [float(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([\d.]+)s", f.read_text())]
        return sum(secs[2:4]) if len(secs) >= 4 else float("nan")   # the second line: the children's user and system time

    def stop(self):
        "Kill the command's process group if this process started it and it still runs (an interrupted session)."
        p = getattr(self, "_proc", None)
        if p is not None and p.poll() is None:
            try: os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError: pass
            p.wait()


def _smoke(tmp_path_factory)->Background:
    base = shared_dir(tmp_path_factory) / "smoke"
    return Background(base, [sys.executable, "-m", "spline_transformers.cli", "reproduce", "all", "--size", "smoke", "--jobs", "2",
                             "--out", base / "results"])


def _demo(tmp_path_factory)->Background:
    base = shared_dir(tmp_path_factory) / "demo"
    return Background(base, ["spline-transformers", "demo", "--quick", "--out", base / "spline_demo"],
                      env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})   # tiny models: one thread is fastest on 2 busy cores


@pytest.fixture(scope="session", autouse=True)
def _start_shared_runs(request, tmp_path_factory):
    "At the first test: start in the background the shared runs that some selected test needs."
    started = []
    for needs, run in ((needs_smoke, _smoke), (needs_demo, _demo)):
        if any(needs(it) for it in request.session.items):
            b = run(tmp_path_factory)
            if b.start(): started.append(b); _started.append(b)
    yield
    s = request.session
    for b in started:   # a run that stops early kills them; otherwise they finish (another worker may be waiting for them)
        if s.shouldfail or s.shouldstop: b.stop()
        else: b.wait()


_started = []
def pytest_keyboard_interrupt(excinfo):
    for b in _started: b.stop()


@pytest.fixture(scope="session")
def _smoke_done(tmp_path_factory):
    b = _smoke(tmp_path_factory)
    return b.folder / "results", b.wait()


@contextlib.contextmanager
def file_lock(path:Path, shared:bool=False):
    "Hold an exclusive lock on file `path` (across processes: the xdist workers), or with `shared` one that readers share."
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try: yield
        finally: fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture
def smoke_run(_smoke_done, tmp_path_factory, tmp_path):
    """The session's one `spline-transformers reproduce all --size smoke --jobs 2 --out <folder>`: (a copy of its results
    folder, CompletedProcess). Every test and chapter that needs a smoke run reads a copy of this one (about 9 MB), so they
    run side by side (a `reproduce` in a folder locks it); they share `smoke.lock`, which `quiet_cores` takes alone."""
    out, r = _smoke_done
    copy = tmp_path / "smoke_results"
    if out.is_dir(): shutil.copytree(out, copy, symlinks=True)
    with file_lock(shared_dir(tmp_path_factory) / "smoke.lock", shared=True): yield copy, r


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """The session's one `spline-transformers demo --quick --out <folder>` (one thread): (its folder, CompletedProcess).
    The CLI tests and chapter 22 read this one."""
    b = _demo(tmp_path_factory)
    return b.folder / "spline_demo", b.wait(timeout=900)


# ---------------------------------------------------------------- under xdist, the site waits for every chapter of the run
def _chapter(item):
    "The notebook a chapter test executes, or None."
    cs = getattr(item, "callspec", None)
    return cs.params.get("nb") if cs and getattr(item, "originalname", None) == "test_notebook" else None


def pytest_runtest_teardown(item):
    if _chapter(item) and WORKER:   # tell the other workers this chapter is done (passed or not)
        d = shared_dir(item.config._tmp_path_factory) / "chapters_done"; d.mkdir(exist_ok=True); (d / Path(_chapter(item)).stem).touch()


def pytest_runtest_setup(item):
    "Under xdist, a docs test starts when every chapter test of this run has finished on whichever worker ran it."
    if not (WORKER and item.get_closest_marker("docs")): return
    want = {Path(_chapter(it)).stem for it in item.session.items if _chapter(it)}
    d, t0 = shared_dir(item.config._tmp_path_factory) / "chapters_done", time.time()
    while want - {f.name for f in d.glob("*")} if d.is_dir() else want:
        if item.session.shouldfail or item.session.shouldstop or time.time() - t0 > 3600: break
        time.sleep(1)


@pytest.fixture
def quiet_cores(tmp_path_factory):
    """JupyterLab's Run All races the browser's late slider echoes against the kernel's queue; with the site build or a
    smoke-reading chapter on the other core the race is lost often enough to show as phantom edits. Tests that drive
    JupyterLab take both locks, so neither runs beside them (the order is smoke then site: no other holder takes both)."""
    if not WORKER: yield; return
    shared = shared_dir(tmp_path_factory)
    with file_lock(shared / "smoke.lock"), file_lock(shared / "site.lock"): yield


_build_site = build_docs.build


def _build_once(*args, **kwargs):
    "Under xdist, the docs tests may run on both workers: the first builds the site, the other waits for it and reuses it."
    if not WORKER: return _build_site(*args, **kwargs)
    shared = shared_dir(_config._tmp_path_factory)
    with file_lock(shared / "site.lock"):
        built = shared / "site_built"
        if built.is_file(): return Path(built.read_text())
        site = _build_site(*args, **kwargs)
        built.write_text(str(site)); return site


build_docs.build = _build_once


# ---------------------------------------------------------------- times: the slowest tests (--durations) and chapters
TEST_TIMES = build_docs.STAGE.parent / "test_times.json"   # every test's wall and CPU seconds of the last run


def _cpu_ticks():
    "(busy, total) CPU ticks of the whole machine since boot, from /proc/stat (None where there is none)."
    try: v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError): return None
    total = sum(v[:8])   # user nice system idle iowait irq softirq steal (guest time is already inside user and nice)
    return total - v[3] - v[4], total   # idle and iowait are not busy


def cores_busy(config)->float:
    "The fraction of the machine's CPU time that was busy since this session started (this run and anything beside it), or None."
    t0, t1 = getattr(config, "_ticks", None), _cpu_ticks()
    return (t1[0] - t0[0]) / max(1, t1[1] - t0[1]) if t0 and t1 else None


def pytest_sessionstart(session):
    session.config._t_start, session.config._times, session.config._ticks = time.time(), {}, _cpu_ticks()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    "Attach the CPU seconds of a test (setup to teardown; this process and the child processes it waited for) to its teardown report."
    if call.when == "setup": item._cpu0 = os.times()
    elif call.when == "teardown" and hasattr(item, "_cpu0"):
        t0, t1 = item._cpu0, os.times()
        item.user_properties += [("cpu_s", round(t1.user - t0.user + t1.system - t0.system, 2)),
                                 ("children_cpu_s", round(t1.children_user - t0.children_user + t1.children_system - t0.children_system, 2))]
    yield


def pytest_runtest_logreport(report):
    "Collect each test's wall seconds (setup + call + teardown) and CPU seconds, here or from the xdist workers."
    times = getattr(_config, "_times", None)
    if times is None: return
    t = times.setdefault(report.nodeid, {"wall_s": 0.0})
    t["wall_s"] = round(t["wall_s"] + report.duration, 2)
    if report.when == "setup":   # when and where it ran: the run's timeline (seconds from the session's start, and the xdist worker)
        t["start_s"] = round(getattr(report, "start", _config._t_start) - _config._t_start, 1)
        node = getattr(report, "node", None)
        if node is not None: t["worker"] = getattr(getattr(node, "gateway", None), "id", None)
    t.update({k: v for k, v in report.user_properties if k.endswith("cpu_s")})
    if report.when == "call": t["outcome"] = report.outcome


_config = None
def pytest_configure(config):
    global _config; _config = config


def pytest_sessionfinish(session):
    "Write `_build/test_times.json` (slowest first) in the process that reports (the controller under xdist)."
    times = getattr(session.config, "_times", None)
    if WORKER or not times: return
    TEST_TIMES.parent.mkdir(parents=True, exist_ok=True)
    rows = dict(sorted(times.items(), key=lambda kv: -kv[1]["wall_s"]))
    shared = {name: {"cpu_s": round(b.cpu_s(), 1), "returncode": int(b.rc_file.read_text())}
              for name, b in (("smoke", _smoke(session.config._tmp_path_factory)), ("demo", _demo(session.config._tmp_path_factory)))
              if b.rc_file.is_file()}
    busy = cores_busy(session.config)
    TEST_TIMES.write_text(json.dumps({"started": session.config._t_start, "wall_s": round(time.time() - session.config._t_start, 1),
                                      "cores": os.cpu_count(), "cores_busy": None if busy is None else round(busy, 3),
                                      "shared_runs": shared, "tests": rows}, indent=1))


def pytest_terminal_summary(terminalreporter, config):
    "After pytest's slowest tests: the chapters executed in this session, slowest first (nbdev's runner's times)."
    busy = cores_busy(config)
    if busy is not None and not WORKER:
        terminalreporter.write_line(f"machine: {os.cpu_count()} cores, {busy:.0%} busy over the run (this run and anything beside it)")
    for name, b in (("smoke run", _smoke(config._tmp_path_factory)), ("quick demo", _demo(config._tmp_path_factory))):
        if b.rc_file.is_file():   # the session's shared runs: their CPU is not in any test's own
            terminalreporter.write_line(f"shared {name}: {b.cpu_s():.0f} CPU s (exit {b.rc_file.read_text().strip()}): {' '.join(b.cmd[-8:])}")
    ran = {m[1] for nid in getattr(config, "_times", {}) if (m := re.search(r"::test_notebook\[([^\]]+)\]", nid))}
    times = {c: t for c, t in build_docs.chapter_times(since=getattr(config, "_t_start", 0)).items() if c in ran}
    if not times: return
    terminalreporter.write_sep("=", f"chapter times (nbdev's runner, slowest first; also in {build_docs.TIMES.relative_to(ROOT)}/)")
    for line in build_docs.times_table(times, n=15): terminalreporter.write_line(line)
    terminalreporter.write_line(f"every test's wall and CPU seconds: {TEST_TIMES.relative_to(ROOT)}")
