"""What prefix caching costs the engine: µs per iteration of the same run with memory.prefix_caching off and on,
interleaved in fresh processes (this machine drifts by ±30% over minutes: 3 rounds, each the best of ``--repeat``
simulations), and the wall time of whole runs (issue 36's speed acceptance: on at most 1.5x off; Mooncake's
conversation trace at full size in at most 2 minutes).

    python bench/prefix_speed.py [--repeat 3] [--rounds 3] "OVERRIDES" ["OVERRIDES" ...]

Each OVERRIDES is one config (space-separated Hydra overrides, without memory.prefix_caching). Prints one Markdown
row per config: iterations, µs per iteration off and on, the ratio, the hit rate, and the seconds of one whole run
(``api.simulate``: requests built, the run, the tables) with caching on.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = r'''
import sys, json, time, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, sys.argv[1])
from kvstudy import api
cfg = api.compose(sys.argv[3:] + ["engine.progress=false"])
best = None
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    res, s = api.simulate(cfg)
    wall = time.perf_counter() - t0
    if best is None or s["simulate_seconds"] < best[0]:
        best = (s["simulate_seconds"], wall)
print(json.dumps({"us": best[0] / len(res.iterations) * 1e6, "its": len(res.iterations), "wall": best[1],
                  "hit": s.get("prefix_hit_rate"), "status": s["status"]}))
'''


def once(overrides, on: bool, repeat: int) -> dict:
    args = [sys.executable, "-c", CODE, str(ROOT), str(repeat)] + overrides + [f"memory.prefix_caching={str(on).lower()}"]
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        sys.stderr.write(r.stderr[-2000:])
        raise SystemExit(f"run failed: {' '.join(overrides)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="simulations per process (the best counts)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating off/on processes per config")
    ap.add_argument("configs", nargs="+")
    args = ap.parse_args(argv)
    print("| config | iterations | µs/it off | µs/it on | on/off | hit rate | run with caching (s) |\n"
          "|---|---|---|---|---|---|---|")
    for text in args.configs:
        overrides = text.split()
        off, on = [], []
        for _ in range(args.rounds):
            off.append(once(overrides, False, args.repeat))
            on.append(once(overrides, True, args.repeat))
        b, w = min(off, key=lambda r: r["us"]), min(on, key=lambda r: r["us"])
        print(f"| {text} | {w['its']:,} | {b['us']:.1f} | {w['us']:.1f} | {w['us'] / b['us']:.2f}x | "
              f"{100 * (w['hit'] or 0):.1f}% | {min(r['wall'] for r in on):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
