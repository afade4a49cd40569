"""Full-size check of regime=authors: every run of a finished ``+experiment=table1 regime=authors`` sweep (or of
``+experiment=table1_batch_cap``) against the independent reference of the authors' scripts
(tests/authors_reference.py), request by request.

    python -m kvstudy +experiment=table1 regime=authors
    python bench/authors_match.py [outputs/table1/authors | outputs/table1_batch_cap/authors]

Prints, per algorithm, how many runs were compared, how many match, the largest difference, and runs whose status
differs. A run that terminates matches when every request completes at the reference's time (to 1e-6 s). A run
kvstudy ends ``no_progress`` (``engine.stall_limit`` clearing events in a row without a completion) matches when the
reference, stopped 500 batches after kvstudy's last iteration, is still clearing (more clearing events than kvstudy's)
and its schedule up to kvstudy's last instant is kvstudy's: every request kvstudy completed, the reference completed
at the same time, and no other by then. Requests the reference completes later are counted (``later``): a run that
is slow, not stuck, which the stall limit ended.
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvstudy import analysis  # noqa: E402
from tests import authors_reference  # noqa: E402

ALGO = {"mcsf": "mcsf", "mc_benchmark": "mc_benchmark", "alpha_greedy": "alpha_greedy", "alpha_beta": "alpha_beta"}


def main(folder: str = "outputs/table1/authors") -> int:
    df = analysis.load_sweep(folder)
    rows = defaultdict(lambda: {"runs": 0, "match": 0, "worst": 0.0, "status_differs": 0, "seconds": 0.0, "later": 0})
    for _, run in df.sort_values(["policy.name", "seed"]).iterrows():
        req = analysis.requests(run)
        kw = {}
        cap = run.get("engine.max_batch")
        if cap is not None and cap == cap:
            kw["batch_cap"] = int(cap)
        if run["policy.name"].startswith("alpha"):
            beta = run.get("policy.beta")
            kw.update(alpha=float(run["policy.alpha"]), beta=None if beta is None or beta != beta else float(beta),
                      seed=int(run["seed"]))
        started = time.perf_counter()
        ref = authors_reference.simulate(ALGO[run["policy.name"]], req.arrival_time.tolist(), req.prompt_tokens.tolist(),
                                         req.output_tokens.tolist(), int(run["memory.capacity_tokens"]),
                                         avg_batch_time=float(run.get("policy.avg_batch_time", 0.05) or 0.05),
                                         # a livelock kvstudy ended (no_progress) spins in the script: a budget of
                                         # batches a little past kvstudy's iterations shows it still resetting
                                         max_batches=int(run["iterations"]) + 500 if run["status"] == "no_progress"
                                         else 10_000_000, **kw)
        r = rows[run["algorithm"]]
        r["seconds"] += time.perf_counter() - started
        r["runs"] += 1
        ours = req.completion_time.to_numpy()
        theirs = np.array([np.nan if c is None else c for c in ref["completion"]])
        done = ~np.isnan(ours)
        its = analysis.iterations(run)
        stop = float((its["start"] + its["duration"]).max()) if len(its) else 0.0
        # a run kvstudy stopped: the reference's schedule up to that instant must be the same (it may finish more later)
        before = ~np.isnan(theirs) & (theirs <= stop + 1e-6) if run["status"] == "no_progress" else ~np.isnan(theirs)
        same_set = np.array_equal(done, before)
        worst = float(np.max(np.abs(ours[done] - theirs[done]))) if done.any() and same_set else float("inf")
        livelock = (run["status"] == "no_progress" and ref["status"] == "max_batches"
                    and ref["resets"] > int(run["clearing_events"]))
        if livelock:
            r["later"] += int((~np.isnan(theirs)).sum() - before.sum())
        if run["status"] != "completed" or ref["status"] != "completed":
            r["status_differs"] += not livelock
        ok = worst <= 1e-6 and (livelock or run["status"] == ref["status"] == "completed")
        r["match"] += ok
        r["worst"] = max(r["worst"], worst)
    print(f"{'algorithm':44s} {'runs':>5s} {'match':>6s} {'max |diff| s':>13s} {'status differs':>15s} "
          f"{'ref s/run':>9s} {'later':>6s}")
    for name, r in rows.items():
        print(f"{name:44s} {r['runs']:5d} {r['match']:6d} {r['worst']:13.3g} {r['status_differs']:15d} "
              f"{r['seconds'] / r['runs']:9.2f} {r['later']:6d}")
    print("later: requests the reference completed after kvstudy stopped a run no_progress (engine.stall_limit)")
    return 0 if all(r["match"] == r["runs"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
