"""``python -m kvstudy.optimum study --model 1 [--trials 200 | --only 50 73] [--time-limit 60] [--lns 2] [--cpsat 20] [--lp] [--out FILE [--resume]]``

The synthetic study of Jaillet et al. Sec. 5.1 against the hindsight IP (``study.py``): per seeded trial, the
MC-SF total latency, the best schedule large-neighbourhood search finds from it (``--lns``), then CP-SAT from
that one (``--cpsat``; where CP-SAT proves optimality the exact method is skipped), the exact method's
status, incumbent, bound and gap, the volume and block bounds, optionally the LP relaxation (``--lp``), and the
solve times. The parquet file is rewritten atomically after every trial; ``--resume`` runs only the trials it
does not hold yet (same settings required). ``--only`` runs chosen trials (the same draws as in the full study).

``python -m kvstudy.optimum adversary``: Theorem 4.1's instance for every registered policy.

``python -m kvstudy.optimum bound +policy=mcsf +demand=high workload.num_requests=1000``: a policy's total
latency on a large workload in the unit-time model over the best valid lower bound (volume, block, bucketed LP
relaxation), an upper bound on its optimality gap where the IP is out of reach (``at_scale.py``).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import pandas as pd

from kvstudy.errors import ConfigError, cli_entry
from kvstudy.optimum.cpsat import DEFAULT_FORMULATION, FORMULATIONS
from kvstudy.optimum.study import StudyStopped, seconds_spent, study
from kvstudy.running.paths import prepare_file


#: the largest M of Theorem 4.1's instance: M/2 + 1 requests simulated per policy (the default's largest is 4,096)
MAX_ADVERSARY_M = 1 << 16


@cli_entry
def main(argv=None) -> int:
    from kvstudy.config.validate import finite_args, one_line_parser

    # a usage mistake is one ``error:`` line (status 2), as every kvstudy command's
    parser = one_line_parser()(prog="python -m kvstudy.optimum", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("study")
    st.add_argument("--model", type=int, choices=(1, 2), required=True)
    st.add_argument("--trials", type=int, default=200, help="run trials 0 .. TRIALS-1")
    st.add_argument("--only", type=int, nargs="+", default=None, metavar="TRIAL",
                    help="run just these trial numbers (instead of --trials); trial i is the same draw either way")
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
    st.add_argument("--cpsat-formulation", choices=FORMULATIONS, default=DEFAULT_FORMULATION,
                    help="memory (3) in CP-SAT: one cumulative constraint over the growing footprints, rows in "
                         "each request's completion round (where memory peaks), or both (cpsat.py; bench/"
                         "cpsat_formulations.py compares them)")
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
    st.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="run N trials at a time in worker processes (rows identical to --jobs 1 unless the exact "
                         "method's wall-clock --time-limit stops it)")
    st.add_argument("--warm-start", type=Path, default=None, metavar="FILE",
                    help="start CP-SAT and the exact method from the schedule the study file FILE stores for each "
                         "trial (same model, seed and cut; re-checked first) where it beats LNS's")
    st.add_argument("--resume", action="store_true",
                    help="keep the trials already in --out (made with the same settings) and run only the others")
    adv = sub.add_parser("adversary")
    adv.add_argument("--M", type=int, nargs="*", default=[16, 64, 256, 1024, 4096])
    bnd = sub.add_parser("bound", help="upper bound on a policy's optimality gap for a large unit-time workload")
    bnd.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +policy=mcsf +demand=high "
                                                  "workload.num_requests=1000")
    bnd.add_argument("--buckets", type=int, default=150, help="start-time buckets of the LP relaxation")
    bnd.add_argument("--no-lp", action="store_true", help="volume bound only")
    bnd.add_argument("--lp-time-limit", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.command == "adversary":
        bad = [m for m in args.M if not 4 <= m <= MAX_ADVERSARY_M]
        if bad:
            raise ConfigError(f"--M {bad[0]}: allowed whole numbers >= 4 and <= {MAX_ADVERSARY_M:,} (the instance "
                              f"needs M/2 short requests and a long one of M - 1 tokens)")
        odd = [m for m in args.M if math.isqrt(m) ** 2 != m or math.isqrt(m) % 2]  # kvstudy/optimum/adversary.py
        if odd:
            raise ConfigError(f"--M {odd[0]}: allowed the square of an even number (4, 16, 36, 64, ..., "
                              f"{MAX_ADVERSARY_M:,}): the short requests arrive sqrt(M)/2 rounds before M, a whole "
                              f"number of rounds")
    if args.command == "study":
        finite_args(time_limit=args.time_limit, cpsat=args.cpsat)
    if args.command == "bound":
        finite_args(lp_time_limit=args.lp_time_limit)
        if args.buckets < 1 or args.lp_time_limit < 0:
            raise ConfigError(f"--buckets {args.buckets}: allowed 1 or more" if args.buckets < 1 else
                              f"--lp-time-limit {args.lp_time_limit}: allowed 0 or more")
    if args.command == "study":
        for flag, value in (("--trials", args.trials), ("--time-limit", args.time_limit), ("--lns", args.lns),
                            ("--jobs", args.jobs - 1), ("--lns-window", args.lns_window - 1)):
            if value < 0:
                low = {"--jobs": "1", "--lns-window": "1"}.get(flag, "0")
                shown = getattr(args, flag[2:].replace("-", "_"))
                raise ConfigError(f"{flag} {shown}: allowed {low} or more")
    if args.command == "bound":
        from kvstudy.optimum.at_scale import gap_bound

        overrides = args.overrides if any(o.startswith("+policy=") for o in args.overrides) else \
            ["+policy=mcsf", *args.overrides]
        from kvstudy import api
        from kvstudy.config.validate import check_config, check_overrides

        check_overrides(overrides)  # the overrides' names and values, in one line, before the run
        check_config(api.compose(overrides))
        row = gap_bound(overrides, buckets=args.buckets, lp=not args.no_lp, time_limit=args.lp_time_limit)
        for key, value in row.items():
            print(f"{key:16s} {value:.6g}" if isinstance(value, float) else f"{key:16s} {value}")
        return 0
    if args.command == "adversary":
        from kvstudy import api
        from kvstudy.optimum.adversary import ratio_lower_bound

        # Theorem 4.1 is about the paper's model (token-granular memory (3), no preemption): the policies that
        # run on paged memory (vLLM's family) decide through another interface and are left out, by name.
        paged = []
        for name in api.options("policy"):
            cfg = api.compose([f"+policy={name}"])
            if cfg.memory.name != "paper":
                paged.append(name)
                continue

            def factory(cfg=cfg):
                return api.build_policy(cfg)
            rows = [ratio_lower_bound(factory, M) for M in args.M]
            print(f"{name:15s} " + "  ".join(f"n={r['n']}: ratio >= {r['ratio_at_least']:.2f}" for r in rows))
        print(f"not run (paged memory, outside the paper's model): {', '.join(paged)}")
        return 0
    if args.cut < 0:
        parser.error(f"--cut {args.cut}: allowed 0 (all requests) or a positive number")
    if args.lns_span < 0:
        parser.error(f"--lns-span {args.lns_span}: allowed 0 (off) or a positive number of rounds")
    if args.cpsat < 0:
        parser.error(f"--cpsat {args.cpsat}: allowed 0 (off) or a positive deterministic time budget")
    if args.exact_max_n < 0:
        parser.error(f"--exact-max-n {args.exact_max_n}: allowed 0 (every instance) or a positive number")
    tag = (f"_cut{args.cut}" if args.cut else "") + ("_lp" if args.lp else "") + \
        (f"_exact{args.exact_max_n}" if args.exact_max_n and args.time_limit > 0 else "") + \
        (f"_cpsat{args.cpsat:g}" if args.cpsat else "") + \
        (f"_{args.cpsat_formulation}" if args.cpsat and args.cpsat_formulation != DEFAULT_FORMULATION else "") + \
        ("_warm" if args.warm_start else "")
    out = args.out or Path(f"outputs/optimum/model{args.model}{tag}.parquet")
    # the output file checked (and its folder made) before the first trial: one line for every file-system mistake
    fix = f"allowed a .parquet file path (e.g. {out / 'study.parquet'})" if os.path.isdir(out) else \
        "choose another file"
    prepare_file(out, "--out", overwrite=args.resume, fix=fix, exists_fix="add --resume to keep its trials and run "
                 "only the others, or choose another file (a study file is never overwritten)")
    try:
        df = study(args.model, args.trials, args.time_limit, args.seed, args.lns, args.lns_window, args.solver,
                   args.cut, args.lp, args.exact_max_n, args.lns_span, args.cpsat, out=out, resume=args.resume,
                   only=args.only, jobs=args.jobs, cpsat_formulation=args.cpsat_formulation,
                   warm_start=args.warm_start)
    except StudyStopped:  # the workers are terminated already; every finished trial is in the file
        done = len(pd.read_parquet(out)) if Path(out).exists() else 0
        kept = f"its {done} finished trial{'s are' if done > 1 else ' is'} in {out}" if done else "no trial had finished"
        print(f"study stopped by SIGTERM; {kept} (run it again with --resume to go on)", file=sys.stderr)
        return 128 + 15
    proven = df["proven_optimal"]
    spent = seconds_spent(df)
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
