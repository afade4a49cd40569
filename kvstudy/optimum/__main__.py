"""``python -m kvstudy.optimum study --model 1 [--trials 200] [--time-limit 60] [--out FILE]``

The synthetic study of Jaillet et al. Sec. 5.1 against the hindsight IP: per seeded trial, the MC-SF total
latency, the IP's status, incumbent, bound and gap (HiGHS, MC-SF warm start), the volume bound and the
solve time. A ratio MC-SF / OPT is exact only where the IP proved optimality; elsewhere it lies in
[MC-SF / incumbent, MC-SF / best bound]. Results are written as parquet (atomically) and summarised.

``python -m kvstudy.optimum adversary``: Theorem 4.1's instance for every registered policy.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kvstudy.atomic import write_atomic
from kvstudy.errors import cli_entry


def study(model: int, trials: int, time_limit: float, seed: int = 0) -> pd.DataFrame:
    from kvstudy.optimum.checker import check
    from kvstudy.optimum.instance import synthetic
    from kvstudy.optimum.ip import solve
    from kvstudy.optimum.online import starts
    from kvstudy.policies.mcsf import MCSF

    rows = []
    for trial, ss in enumerate(np.random.SeedSequence([seed, model]).spawn(trials)):
        inst = synthetic(model, np.random.default_rng(ss))
        mcsf_start = starts(inst, MCSF())
        mcsf = check(inst, mcsf_start)
        res = solve(inst, warm_start=mcsf_start, time_limit=time_limit)
        best = min(mcsf, res.objective) if res.objective is not None else mcsf
        bound = res.bound
        rows.append({"model": model, "trial": trial, "n": inst.n, "M": inst.capacity, "mcsf": mcsf,
                     "ip_status": res.status, "incumbent": best, "bound": bound,
                     "proven_optimal": res.proven_optimal, "seconds": res.seconds,
                     "ratio_low": mcsf / best, "ratio_high": mcsf / bound if bound > 0 else np.inf})
        r = rows[-1]
        print(f"model {model} trial {trial:3d}: n={r['n']} M={r['M']} MC-SF {mcsf} "
              f"{'OPT' if r['proven_optimal'] else 'best'} {best} bound {bound:.0f} ({res.status}, {res.seconds:.1f} s)",
              flush=True)
    return pd.DataFrame(rows)


@cli_entry
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstudy.optimum", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("study")
    st.add_argument("--model", type=int, choices=(1, 2), required=True)
    st.add_argument("--trials", type=int, default=200)
    st.add_argument("--time-limit", type=float, default=60.0)
    st.add_argument("--seed", type=int, default=0)
    st.add_argument("--out", type=Path, default=None)
    adv = sub.add_parser("adversary")
    adv.add_argument("--M", type=int, nargs="*", default=[16, 64, 256, 1024, 4096])
    args = parser.parse_args(argv)
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
    df = study(args.model, args.trials, args.time_limit, args.seed)
    out = args.out or Path(f"outputs/optimum/model{args.model}.parquet")
    write_atomic(out, lambda tmp: df.to_parquet(tmp, index=False))
    proven = df["proven_optimal"]
    print(f"proven optimal: {int(proven.sum())} of {len(df)}; solve time total {df['seconds'].sum():.0f} s, "
          f"median {df['seconds'].median():.1f} s")
    if proven.any():
        exact = df.loc[proven, "ratio_low"]
        print(f"MC-SF / OPT where proven: min {exact.min():.3f} max {exact.max():.3f} mean {exact.mean():.3f} "
              f"exact {int((exact == 1).sum())}")
    print(f"MC-SF / best known over all trials: mean {df['ratio_low'].mean():.3f}; MC-SF / bound: mean "
          f"{df['ratio_high'].mean():.3f}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
