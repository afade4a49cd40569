"""``python -m kvstudy.optimum study --model 1 [--trials 200] [--time-limit 60] [--lns 2] [--cpsat 20] [--lp] [--out FILE]``

The synthetic study of Jaillet et al. Sec. 5.1 against the hindsight IP: per seeded trial, the MC-SF total
latency, the best schedule large-neighbourhood search finds from it (``--lns``), then CP-SAT from that one
(``--cpsat``; where CP-SAT proves optimality the exact method is skipped), the exact method's status,
incumbent, bound and gap (best schedule as warm start), the volume and block bounds, optionally the LP
relaxation with block rows (``--lp``), and the solve times. A ratio MC-SF / OPT is exact only where the exact
method proved optimality; elsewhere it lies in [MC-SF / incumbent, MC-SF / best bound]. Results are written
as parquet (atomically) and summarised.

``python -m kvstudy.optimum adversary``: Theorem 4.1's instance for every registered policy.

``python -m kvstudy.optimum bound +policy=mcsf +demand=high workload.num_requests=1000``: a policy's total
latency on a large workload in the unit-time model over the best valid lower bound (volume, block, bucketed LP
relaxation), an upper bound on its optimality gap where the IP is out of reach (``at_scale.py``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kvstudy.atomic import write_atomic
from kvstudy.errors import ConfigError, cli_entry


def study(model: int, trials: int, time_limit: float, seed: int = 0, lns_passes: int = 0,
          lns_window: int = 5, solver: str = "highs", cut: int = 0, lp: bool = False,
          exact_max_n: int = 0, lns_span: int = 0, cpsat: float = 0.0) -> pd.DataFrame:
    from kvstudy.optimum.bounds import block_bound, volume_bound
    from kvstudy.optimum.branch import solve_instance
    from kvstudy.optimum.checker import check
    from kvstudy.optimum.instance import synthetic
    from kvstudy.optimum.ip import solve
    from kvstudy.optimum.lns import improve
    from kvstudy.optimum.lp_bound import lp_bound
    from kvstudy.optimum.online import starts
    from kvstudy.policies.mcsf import MCSF

    if cpsat:  # settings refused before the first trial: below, a ConfigError from CP-SAT costs one trial only
        from kvstudy.optimum.cpsat import require

        require(cpsat, "study --cpsat")
    rows = []
    for trial, ss in enumerate(np.random.SeedSequence([seed, model]).spawn(trials)):
        inst = synthetic(model, np.random.default_rng(ss))
        if cut:  # the first `cut` requests in arrival order: Sec. 5.1's distribution at a size the IP can prove
            inst = type(inst)(inst.arrival[:cut], inst.prompt[:cut], inst.output[:cut], inst.capacity)
        mcsf_start = starts(inst, MCSF())
        mcsf = check(inst, mcsf_start)
        best, best_start = mcsf, mcsf_start
        row = {"model": model, "trial": trial, "n": inst.n, "M": inst.capacity, "mcsf": mcsf}
        if lns_passes > 0:
            lns = improve(inst, mcsf_start, window=lns_window, max_passes=lns_passes, span=lns_span)
            row.update(lns=lns.objective, lns_moves=lns.moves, lns_seconds=lns.seconds)
            best, best_start = lns.objective, lns.start
        cp_proven = False
        small = exact_max_n <= 0 or inst.n <= exact_max_n
        if cpsat and small:  # CP-SAT from the best schedule so far (cpsat.py); a proof there skips the exact method
            from kvstudy.optimum.cpsat import improve as cp_improve

            try:
                cp = cp_improve(inst, best_start, cpsat, seed=seed)
            except ConfigError as exc:  # one failed child (killed, out of memory) costs this trial's CP-SAT only
                row.update(cpsat=best, cpsat_status=f"error: {exc}", cpsat_bound=0.0, cpsat_seconds=np.nan)
                print(f"model {model} trial {trial:3d}: CP-SAT skipped, {exc}", flush=True)
            else:
                row.update(cpsat=cp.objective, cpsat_status=cp.status, cpsat_bound=cp.bound,
                           cpsat_seconds=cp.seconds)
                best, best_start, cp_proven = cp.objective, cp.start, cp.proven_optimal
        row.update(volume_bound=volume_bound(inst), block_bound=block_bound(inst))
        bound = max(row["volume_bound"], row["block_bound"])
        if lp:  # LP relaxation with block rows; the best schedule's makespan is a valid horizon (lp_bound.py)
            res = lp_bound(inst, horizon=int((best_start + inst.output).max()))
            row.update(lp_bound=res.value, lp_seconds=res.seconds)
            bound = max(bound, res.value)
        if "cpsat_bound" in row:
            bound = max(bound, row["cpsat_bound"])
        status, proven, seconds = "skipped", False, 0.0
        if cp_proven:
            status, proven = "optimal (cpsat)", True
        elif time_limit > 0 and small:
            if solver == "branch":
                res = solve_instance(inst, warm_start=best_start, time_limit=time_limit)
            else:
                res = solve(inst, warm_start=best_start, time_limit=time_limit, solver=solver)
            status, proven, seconds = res.status, res.proven_optimal, res.seconds
            bound = max(bound, res.bound)
            if res.objective is not None:
                best = min(best, res.objective)
        if proven:
            bound = best
        row.update(ip_status=status, incumbent=best, bound=bound, proven_optimal=proven, seconds=seconds,
                   ratio_low=mcsf / best, ratio_high=mcsf / bound if bound > 0 else np.inf)
        rows.append(row)
        print(f"model {model} trial {trial:3d}: n={inst.n} M={inst.capacity} MC-SF {mcsf} "
              f"{'OPT' if proven else 'best'} {best} bound {bound:.0f} (IP {status}, {seconds:.1f} s; "
              f"LNS {row.get('lns_seconds', 0.0):.1f} s, CP-SAT {row.get('cpsat_seconds', 0.0):.1f} s)", flush=True)
    return pd.DataFrame(rows)


@cli_entry
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstudy.optimum", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("study")
    st.add_argument("--model", type=int, choices=(1, 2), required=True)
    st.add_argument("--trials", type=int, default=200)
    st.add_argument("--time-limit", type=float, default=60.0,
                    help="seconds for the exact method (--solver) per instance; 0 skips it (bound = bounds.best_bound)")
    st.add_argument("--lns", type=int, default=0, metavar="PASSES",
                    help="passes of large-neighbourhood search from MC-SF's schedule per instance (lns.py); 0 skips")
    st.add_argument("--lns-window", type=int, default=5)
    st.add_argument("--lns-span", type=int, default=0, metavar="ROUNDS",
                    help="also free the requests active in each stretch of ROUNDS rounds (lns.py; 0: off). Cut-10 "
                         "Arrival Model 2: LNS above OPT 3.9%% -> 1.6%% on average; paper sizes: <0.1%% for 3x time")
    st.add_argument("--cpsat", type=float, default=0.0, metavar="WORK",
                    help="after LNS, search with OR-Tools CP-SAT for WORK deterministic-time units per instance "
                         "(cpsat.py; 0: off; needs the cpsat extra); its proofs count as optimal")
    st.add_argument("--solver", choices=("highs", "gurobi", "branch"), default="highs",
                    help="exact method: the IP with HiGHS or Gurobi, or kvstudy's branch-and-bound (branch.py)")
    st.add_argument("--exact-max-n", type=int, default=0, metavar="N",
                    help="run the exact method and CP-SAT only on instances of at most N requests (0: on all); "
                         "the others keep LNS and bounds, ip_status 'skipped'")
    st.add_argument("--cut", type=int, default=0, metavar="N",
                    help="keep only the first N requests of each drawn instance (0: all, the paper's sizes)")
    st.add_argument("--lp", action="store_true",
                    help="also the LP relaxation with block rows (lp_bound.py; ~15-60 s per paper-size instance)")
    st.add_argument("--seed", type=int, default=0)
    st.add_argument("--out", type=Path, default=None)
    adv = sub.add_parser("adversary")
    adv.add_argument("--M", type=int, nargs="*", default=[16, 64, 256, 1024, 4096])
    bnd = sub.add_parser("bound", help="upper bound on a policy's optimality gap for a large unit-time workload")
    bnd.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +policy=mcsf +demand=high "
                                                  "workload.num_requests=1000")
    bnd.add_argument("--buckets", type=int, default=150, help="start-time buckets of the LP relaxation")
    bnd.add_argument("--no-lp", action="store_true", help="volume bound only")
    bnd.add_argument("--lp-time-limit", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.command == "bound":
        from kvstudy.optimum.at_scale import gap_bound

        overrides = args.overrides if any(o.startswith("+policy=") for o in args.overrides) else \
            ["+policy=mcsf", *args.overrides]
        row = gap_bound(overrides, buckets=args.buckets, lp=not args.no_lp, time_limit=args.lp_time_limit)
        for key, value in row.items():
            print(f"{key:16s} {value:.6g}" if isinstance(value, float) else f"{key:16s} {value}")
        return 0
    if args.command == "adversary":
        from kvstudy import api
        from kvstudy.optimum.adversary import ratio_lower_bound

        for name in api.options("policy"):
            def factory(name=name):
                policy = api.build_policy(api.compose([f"+policy={name}"]))
                return policy
            rows = [ratio_lower_bound(factory, M) for M in args.M]
            print(f"{name:15s} " + "  ".join(f"n={r['n']}: ratio >= {r['ratio_at_least']:.2f}" for r in rows))
        return 0
    if args.cut < 0:
        parser.error(f"--cut {args.cut}: allowed 0 (all requests) or a positive number")
    if args.lns_span < 0:
        parser.error(f"--lns-span {args.lns_span}: allowed 0 (off) or a positive number of rounds")
    if args.cpsat < 0:
        parser.error(f"--cpsat {args.cpsat}: allowed 0 (off) or a positive deterministic time budget")
    if args.exact_max_n < 0:
        parser.error(f"--exact-max-n {args.exact_max_n}: allowed 0 (every instance) or a positive number")
    df = study(args.model, args.trials, args.time_limit, args.seed, args.lns, args.lns_window, args.solver,
               args.cut, args.lp, args.exact_max_n, args.lns_span, args.cpsat)
    tag = (f"_cut{args.cut}" if args.cut else "") + ("_lp" if args.lp else "") + \
        (f"_exact{args.exact_max_n}" if args.exact_max_n and args.time_limit > 0 else "") + \
        (f"_cpsat{args.cpsat:g}" if args.cpsat else "")
    out = args.out or Path(f"outputs/optimum/model{args.model}{tag}.parquet")
    write_atomic(out, lambda tmp: df.to_parquet(tmp, index=False))
    proven = df["proven_optimal"]
    spent = sum(df[c].fillna(0.0) for c in ("lns_seconds", "cpsat_seconds", "seconds") if c in df)
    print(f"proven optimal: {int(proven.sum())} of {len(df)}; exact-method time total {df['seconds'].sum():.0f} s, "
          f"median {df['seconds'].median():.1f} s; all methods total {spent.sum():.0f} s, median {spent.median():.1f} s")
    if proven.any():
        exact = df.loc[proven, "ratio_low"]
        print(f"MC-SF / OPT where proven: min {exact.min():.3f} max {exact.max():.3f} mean {exact.mean():.3f} "
              f"exact {int((exact == 1).sum())}")
    if "cpsat_status" in df:
        failed = df["cpsat_status"].astype(str).str.startswith("error")
        print(f"CP-SAT ran on {int(df['cpsat_status'].notna().sum())} instances, proved {int((df['cpsat_status'] == 'optimal').sum())}"
              f", failed on {int(failed.sum())}" + (f" (trials {df.loc[failed, 'trial'].tolist()})" if failed.any() else ""))
    low = df["ratio_low"]
    print(f"MC-SF / best known schedule: min {low.min():.3f} max {low.max():.3f} mean {low.mean():.3f}, "
          f"MC-SF is the best known in {int((low == 1).sum())} of {len(df)}; MC-SF / lower bound: mean "
          f"{df['ratio_high'].mean():.3f}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
