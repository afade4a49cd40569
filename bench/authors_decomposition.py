"""Which of regime=authors' differences moves MC-SF's and MC-Benchmark's mean latency (docs/authors_code.md):
the formula alone, then the scripts' check, then the whole regime, and the undefined average batch time.

    python bench/authors_decomposition.py [seeds]      # default 10 seeds, high demand, 1,000 requests
"""
import sys
import warnings

import numpy as np

from kvstudy import api

ROWS = {"vidur default (a100_tp2)": [], "latency=mcsf_authors only": ["latency=mcsf_authors"],
        "+ policy.admission=authors_code": ["latency=mcsf_authors", "policy.admission=authors_code"],
        "regime=authors": ["regime=authors"],
        "regime=authors, avg_batch_time=1/16": ["regime=authors", "policy.avg_batch_time=0.0625"],
        "regime=authors, avg_batch_time=0.1": ["regime=authors", "policy.avg_batch_time=0.1"]}


def main(seeds: int = 10) -> None:
    warnings.filterwarnings("ignore")
    for policy in ("mcsf", "mc_benchmark"):
        for label, overrides in ROWS.items():
            means = [api.simulate(api.compose([f"+policy={policy}", "+demand=high", f"seed={seed}",
                                               "engine.progress=false", *overrides]))[1]["e2e_latency"]["mean"]
                     for seed in range(seeds)]
            print(f"{policy:13s} {label:40s} mean {np.mean(means):7.2f}  (seed 0: {means[0]:.2f})")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
