"""Benchmark the Sec. 5.1 study's worker processes (``study --jobs``) on this machine.

    python bench/study_jobs.py [--model 1] [--trials 8] [--cut 0] [--lns 2] [--jobs 1 2]

Runs the same trials with each number of jobs (LNS and the closed-form bounds only, no wall-clock limit, so
the rows must be identical) and prints wall seconds, the speed-up over one job, and whether the rows match.
Default: 8 paper-size Arrival Model 1 draws with 2 LNS passes, the study's most expensive routine step.
"""
import argparse
import time

from kvstudy.optimum.study import study


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=int, default=1)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--cut", type=int, default=0)
    ap.add_argument("--lns", type=int, default=2)
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    first, base = None, None
    print(f"model {args.model}, {args.trials} trials, cut {args.cut or 'none'}, LNS {args.lns} passes")
    for jobs in args.jobs:
        began = time.perf_counter()
        df = study(args.model, args.trials, time_limit=0, lns_passes=args.lns, cut=args.cut, jobs=jobs)
        wall = time.perf_counter() - began
        rows = df.drop(columns=[c for c in df.columns if "seconds" in c])
        same = True if first is None else rows.equals(first)
        first = rows if first is None else first
        base = wall if base is None else base
        print(f"jobs {jobs}: {wall:7.1f} s wall, speed-up {base / wall:4.2f}x, LNS s summed {df['lns_seconds'].sum():7.1f}, "
              f"rows identical to jobs {args.jobs[0]}: {same}", flush=True)


if __name__ == "__main__":
    main()
