"""Per-iteration cost of each registered policy inside the card command's setting (Llama2-70B on 2xA100,
M = 16492, 1,000 LMSYS-like requests, lambda = 50, Vidur latency), each on its own memory model (admission-only
policies on memory=paper unless ``memory=paged`` is passed): the engine loop's wall time divided by the iterations it
ran (engine + policy + latency lookup), best of three.

    python bench/policy_cost.py [extra overrides]
"""
import sys

from kvstudy import api


def main(extra):
    print("| policy | memory | iterations | engine loop s | us per iteration | status |")
    print("|---|---|---|---|---|---|")
    for name in api.options("policy"):
        cfg = api.compose([f"+policy={name}", "+demand=high", "engine.progress=false"] + extra)
        best = None
        for _ in range(3):
            result, summary = api.simulate(cfg)
            best = summary["simulate_seconds"] if best is None else min(best, summary["simulate_seconds"])
        iters = len(result.iterations)
        print(f"| {name} | {cfg.memory.name} | {iters} | {best:.3f} | {best / iters * 1e6:.1f} | {result.status} |",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
