"""Benchmark the hindsight-optimum tools on this machine.

    python bench/optimum_search.py [--quick]

1. Time to a proof of optimality, HiGHS IP vs the branch-and-bound (and CP-SAT, cpsat.py, when OR-Tools is
   installed; wall seconds including its child process), on issue 5's 7-request counterexample and on
   Model-1-like instances cut to n requests (the first n of a Sec. 5.1 draw): where exactness stops.
2. Large-neighbourhood search on paper-size Model 1 trials (the study's settings): seconds and gain over MC-SF.
3. The gap bound at scale (volume, block and bucketed LP bounds) on 1,000 LMSYS-like requests.
"""
import argparse
import time

import numpy as np

from kvstudy.optimum import branch, cpsat
from kvstudy.optimum.checker import check
from kvstudy.optimum.instance import Instance, synthetic
from kvstudy.optimum.ip import solve
from kvstudy.optimum.lns import improve
from kvstudy.optimum.online import starts
from kvstudy.policies.mcsf import MCSF


def by_branch(inst, incumbent, limit):
    res = branch.solve(inst.arrival, inst.prompt, inst.output, np.full(inst.horizon() + 1, inst.capacity),
                       incumbent=incumbent, time_limit=limit, node_limit=10**9)
    return check(inst, res.start), res.proven, res.seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--limit", type=float, default=60.0)
    parser.add_argument("--cp-work", type=float, default=10.0, help="CP-SAT deterministic time per instance")
    args = parser.parse_args()
    sizes = (6, 8) if args.quick else (6, 8, 10, 12)
    cases = [("counterexample n=7", Instance(np.zeros(7, int), np.array([4, 5, 3, 4, 5, 2, 1]),
                                             np.array([14, 13, 41, 42, 1, 24, 40]), 49))]
    for n in sizes:
        for k in range(2):
            full = synthetic(1, np.random.default_rng([99, n, k]))
            cases.append((f"model-1 cut n={n} #{k}", Instance(full.arrival[:n], full.prompt[:n], full.output[:n],
                                                              full.capacity)))
    print("1. time to proof (s), HiGHS IP vs branch-and-bound, limit", args.limit)
    for name, inst in cases:
        warm = starts(inst, MCSF())
        ip = solve(inst, warm_start=warm, time_limit=args.limit)
        bb_value, bb_proven, bb_s = by_branch(inst, warm, args.limit)
        line = (f"  {name:22s} MC-SF {check(inst, warm):5d}  IP {ip.objective} {'proven' if ip.proven_optimal else 'open'}"
                f" {ip.seconds:6.1f}  B&B {bb_value} {'proven' if bb_proven else 'open'} {bb_s:6.1f}")
        if cpsat.available():
            cp = cpsat.improve(inst, warm, work=args.cp_work)
            line += f"  CP-SAT {cp.objective} {'proven' if cp.proven_optimal else 'open'} {cp.seconds:6.1f}"
        print(line, flush=True)
    print("2. LNS on Model 1 trials 0-4 of the study: the study's setting (window 5, 2 passes) and a longer search "
          "(window 6, up to 8 passes) from its result")
    for trial, ss in enumerate(np.random.SeedSequence([0, 1]).spawn(3 if args.quick else 5)):
        inst = synthetic(1, np.random.default_rng(ss))
        t0 = time.perf_counter()
        mcsf = starts(inst, MCSF())
        res = improve(inst, mcsf, window=5, max_passes=2)
        line = (f"  trial {trial}: n={inst.n} MC-SF {res.initial} -> {res.objective} "
                f"(ratio {res.initial / res.objective:.3f}) in {time.perf_counter() - t0:.1f} s, {res.solves} windows")
        if not args.quick:
            more = improve(inst, res.start, window=6, max_passes=8)
            line += (f"; longer search -> {more.objective} (ratio {res.initial / more.objective:.3f}) in "
                     f"{more.seconds:.1f} s more")
        print(line, flush=True)
    if not args.quick:
        from kvstudy.optimum.at_scale import gap_bound

        print("3. gap bound at scale")
        for n in (1000, 3000):
            row = gap_bound(["+policy=mcsf", "+demand=high", f"workload.num_requests={n}"])
            print(f"  n={n}: MC-SF {row['policy_latency']} volume {row['volume_bound']:.0f} block "
                  f"{row['block_bound']:.0f} LP {row['lp_bound']:.0f} "
                  f"ratio <= {row['ratio_at_most']:.3f}; LP {row['lp_seconds']} s, total {row['seconds']} s")


if __name__ == "__main__":
    main()
