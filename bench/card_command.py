"""Mean e2e latency of MC-SF and MC-Benchmark at 1,000 requests, lambda = 50, over 5 seeds
(the card command's setting), beside the paper's Table 1, and the wall time of each run.

    python bench/card_command.py [extra overrides]
"""
import sys
import time

import numpy as np

from kvstudy import api

PAPER = {"mcsf": 32.1, "mc_benchmark": 46.5}  # Table 1, mean e2e seconds


def main(extra):
    for policy in ("mcsf", "mc_benchmark"):
        means, walls = [], []
        for seed in range(5):
            cfg = api.compose([f"+policy={policy}", "+demand=high", f"seed={seed}", "engine.progress=false"] + extra)
            t0 = time.perf_counter()
            _, summary = api.simulate(cfg)
            walls.append(time.perf_counter() - t0)
            means.append(summary["e2e_latency"]["mean"])
        print(f"{policy:13s} mean e2e {np.mean(means):.2f} +- {np.std(means, ddof=1):.2f} s over 5 seeds "
              f"(paper {PAPER[policy]}) | per-seed {', '.join(f'{m:.2f}' for m in means)} | "
              f"wall per run: median {np.median(walls):.2f} s, first {walls[0]:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
