"""What every benchmark here shares: the process a user gets, the timing options, and the clock.

A benchmark measures what a user's process gets, no more: it imports the package before torch, which (as for every
user) makes OpenMP threads yield while they wait and raises glibc's heap thresholds with mallopt (see the core
chapter; `SPLINE_TRANSFORMERS_PROCESS=default` turns both off, for the package and the benches alike).
"""
import os, sys, time

CLOCK = [time.perf_counter]  # set from --clock by `start`


def user_process():
    "Set this process up as the package sets up a user's (call before importing torch); returns a line that says how."
    import spline_transformers.core as core
    return (f"process as a user gets it: OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
            f"heap thresholds raised by the package: {core.MALLOC_TUNED}; package from {os.path.dirname(core.__file__)}")


def add_timing_args(ap, rounds=15):
    "The options every benchmark takes: --threads, --stat, --clock, --rounds."
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--stat", choices=["median", "min"], default="median", help="min: the best round (robust to a busy machine)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="cpu: process CPU time (steadier on a busy machine; use with --threads 1)")
    ap.add_argument("--rounds", type=int, default=rounds)


def start(a):
    "Apply the timing options (threads, clock) and print what is measured and the machine's load."
    import torch
    torch.set_num_threads(a.threads)
    CLOCK[0] = time.process_time if a.clock == "cpu" else time.perf_counter
    print(f"clock: {a.clock} time, {a.stat} of the rounds; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(user_process())


SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "asimd", "sve")


def cpu_line():
    """The CPU model (with its x86 family and model numbers: a VM may call a Zen 3 and a Zen 4 both "AMD EPYC") and
    which SIMD extensions it has (from /proc/cpuinfo), for the line above a table."""
    from spline_transformers.core import cpu_model
    flags, ids = set(), {}
    try:
        for line in open("/proc/cpuinfo"):
            key = line.split(":", 1)[0].strip()
            if key in ("cpu family", "model") and key not in ids: ids[key] = line.split(":", 1)[1].strip()
            if key in ("flags", "Features"): flags = set(line.split(":", 1)[1].split()); break
    except OSError: pass
    have = [f for f in SIMD_FLAGS if f in flags]
    fam = f" (family {ids['cpu family']} model {ids['model']})" if len(ids) == 2 else ""
    return f"CPU: {cpu_model()}{fam}, {os.cpu_count()} cores; SIMD: {' '.join(have) if have else 'unknown'}"
