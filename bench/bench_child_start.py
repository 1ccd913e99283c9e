"""What a child process costs to start: `reproduce` of smoke-size experiments with every cell a fresh interpreter
(SPLINE_TRANSFORMERS_WARM_START=0) against cells forked from a warm starter (the default), interleaved in one run.

    python bench/bench_child_start.py [--rounds 2] [--names mano demo]

A smoke cell trains for about a second; a fresh interpreter spends ~4 CPU seconds importing torch, the package and
torch._dynamo first (every optimizer imports it on first use). Prints wall seconds per round, the median ratio, the CPU
model and the load."""
import argparse, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import cpu_line  # noqa: E402


def run(names:list, warm:bool, out:Path)->float:
    env = {**os.environ, "SPLINE_TRANSFORMERS_WARM_START": "1" if warm else "0"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "spline_transformers.cli", "reproduce", *names, "--size", "smoke", "--jobs", "2",
                    "--out", str(out), "--quiet"], env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--names", nargs="+", default=["mano", "demo"])
    a = ap.parse_args()
    print(cpu_line()); print(f"load before: {os.getloadavg()[0]:.1f}")
    walls = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for warm in (False, True):
                walls[warm].append(run(a.names, warm, Path(tmp) / f"r{r}-{int(warm)}"))
                print(f"round {r}: {'warm starter' if warm else 'fresh interpreters'}: {walls[warm][-1]:.1f} s wall")
    fresh, warm = statistics.median(walls[False]), statistics.median(walls[True])
    print(f"reproduce {' '.join(a.names)} --size smoke --jobs 2: fresh {fresh:.1f} s, warm {warm:.1f} s, {fresh / warm:.2f}x "
          f"(median of {a.rounds}); load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
