"""Per-iteration cost of each registered policy inside the card command's setting (Llama2-70B on 2xA100,
M = 16492, 1,000 LMSYS-like requests, lambda = 50, Vidur latency): wall time of the engine loop divided
by the iterations it ran (engine + policy + latency lookup), best of three.

    python bench/policy_cost.py [extra overrides]
"""
import sys
import time

import numpy as np

from kvstudy import api
from kvstudy.engine import Engine


def main(extra):
    print("| policy | iterations | engine loop s | us per iteration | status |")
    print("|---|---|---|---|---|")
    for name in api.options("policy"):
        cfg = api.compose([f"+policy={name}", "+demand=high", "engine.progress=false"] + extra)
        arch, hw, capacity, latency = api.model_setup(cfg)

        requests, predicted = api.build_requests(cfg, arch, np.random.SeedSequence(int(cfg.seed)))
        best = None
        for _ in range(3):
            policy = api.build_policy(cfg)
            policy.reset(int(cfg.seed))
            engine = Engine(requests, predicted, policy, latency, capacity)
            t0 = time.perf_counter()
            result = engine.run()
            wall = time.perf_counter() - t0
            best = wall if best is None else min(best, wall)
        iters = len(result.iterations)
        print(f"| {name} | {iters} | {best:.3f} | {best / iters * 1e6:.1f} | {result.status} |")


if __name__ == "__main__":
    main(sys.argv[1:])
