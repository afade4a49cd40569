"""Benchmark CP-SAT's memory formulations (``cpsat.FORMULATIONS``) on Sec. 5.1 draws.

    python bench/cpsat_formulations.py [--model 1] [--trials 100] [--cut 10] [--max-n 0] [--work 10]
                                       [--formulations cumulative completion both]

Per draw: MC-SF, then LNS (window 5, 2 passes, as the study runs it), then ``cpsat.improve`` from the LNS
schedule once per formulation with the same deterministic budget and seed. Prints, per formulation, how many
draws CP-SAT proves optimal, the mean latency it ends with, its wall seconds (total, median), and whether every
formulation that proves a draw finds the same optimum. ``--max-n N`` keeps only draws of at most N requests
(e.g. ``--cut 0 --model 2 --max-n 30``: the paper-size draws the study hands to CP-SAT).
"""
import argparse

import numpy as np

from kvstudy.optimum import cpsat
from kvstudy.optimum.lns import improve as lns
from kvstudy.optimum.online import starts
from kvstudy.optimum.study import instance
from kvstudy.policies.mcsf import MCSF


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=int, default=1)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--cut", type=int, default=10)
    ap.add_argument("--max-n", type=int, default=0)
    ap.add_argument("--work", type=float, default=10.0)
    ap.add_argument("--formulations", nargs="+", default=list(cpsat.FORMULATIONS), choices=cpsat.FORMULATIONS)
    args = ap.parse_args()
    rows = {f: [] for f in args.formulations}
    optimum_agrees = True
    for trial in range(args.trials):
        inst = instance(args.model, trial, 0, args.cut)
        if args.max_n and inst.n > args.max_n:
            continue
        start = lns(inst, starts(inst, MCSF()), window=5, max_passes=2).start
        proven = set()
        for f in args.formulations:
            res = cpsat.improve(inst, start, args.work, formulation=f)
            rows[f].append((res.proven_optimal, res.objective, res.seconds))
            if res.proven_optimal:
                proven.add(res.objective)
        optimum_agrees &= len(proven) <= 1
        print(f"trial {trial:3d} n={inst.n}: " + ", ".join(
            f"{f} {'OPT' if p else 'best'} {v} ({s:.1f} s)" for f in args.formulations for p, v, s in [rows[f][-1]]),
            flush=True)
    print(f"model {args.model}, cut {args.cut or 'none'}, max n {args.max_n or 'any'}, work {args.work}: "
          f"{len(rows[args.formulations[0]])} draws")
    for f, r in rows.items():
        p, v, s = (np.array(x) for x in zip(*r))
        print(f"{f:>10}: proven {int(p.sum())}, mean latency {v.mean():.1f}, wall s total {s.sum():.1f}, "
              f"median {np.median(s):.1f}")
    print(f"every proof gives the same optimum: {optimum_agrees}")


if __name__ == "__main__":
    main()
