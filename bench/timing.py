"""What every benchmark here shares: heap settings, the timing options, and the clock.

glibc hands allocations over 32 MiB to fresh mmaps (page faults cost more than the op), and setting the mmap
threshold by hand pins the trim threshold at 128 KiB (every step would page-fault its activations back in), so a
benchmark re-executes itself with both raised unless they are already set.
"""
import os, sys, time

CLOCK = [time.perf_counter]  # set from --clock by `start`


def reexec_with_heap_settings():
    "Re-run this script with MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ raised (call before importing torch)."
    if "MALLOC_MMAP_THRESHOLD_" in os.environ: return
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(1 << 30)
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 30))
    os.execv(sys.executable, [sys.executable] + sys.argv)


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
