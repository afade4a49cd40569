"""Engine µs per iteration of two checkouts, interleaved (this machine drifts by ±30% over minutes, so the two are
run alternately in fresh processes: 3 rounds, each the best of 3 simulations; ROUNDS=5 in the environment for more).
Pin it to one core to keep the other's load out: ``taskset -c 1 python bench/ab_cost.py ...``.

    git worktree add /tmp/base <commit>
    python bench/ab_cost.py /tmp/base 5000 "+policy=mcsf +demand=high" "+policy=vllm +demand=high"

Prints one Markdown row per config: before µs, after µs (this checkout), change.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

CODE = r'''
import os, sys, json
sys.path.insert(0, sys.argv[1])
from kvstudy import api
if os.environ.get("AB_GC") == "freeze":  # the heap before the runs left out of the collector's passes
    import gc; gc.collect(); gc.freeze()
cfg = api.compose(sys.argv[3:] + ["engine.progress=false", f"workload.num_requests={sys.argv[2]}"])
best, its = None, 0
for _ in range(3):
    res, s = api.simulate(cfg)
    best = s["simulate_seconds"] if best is None else min(best, s["simulate_seconds"])
    its = len(res.iterations)
print(json.dumps(best / its * 1e6))
'''


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    trees = {"base": argv[0], "new": str(Path(__file__).resolve().parent.parent)}
    n, configs = argv[1], [a.split() for a in argv[2:]]
    print("| config | requests | before µs | after µs | change |\n|---|---|---|---|---|")
    for cfg in configs:
        res = {"base": [], "new": []}
        for _ in range(int(os.environ.get("ROUNDS", 3))):
            for name, tree in trees.items():
                r = subprocess.run([sys.executable, "-c", CODE, tree, n] + cfg, capture_output=True, text=True,
                                   cwd=tree)
                try:
                    res[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
                except (IndexError, ValueError):
                    res[name].append(float("nan"))
        b, w = min(res["base"]), min(res["new"])
        print(f"| {' '.join(cfg)} | {n} | {b:.1f} | {w:.1f} | {100 * (w / b - 1):+.0f}% |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
