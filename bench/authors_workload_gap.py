"""How much of the gap between regime=authors and the paper's Table 1 can the request set explain (issue 32, item 5)?

Each seed of ``+experiment=table1 regime=authors`` draws a new set of 1,000 LMSYS-like requests. This regresses each
algorithm's mean latency on its set's total prompt and output tokens and reports: the spread between sets, how many
of the 50 sets reach the paper's mean, and how much longer (in total output tokens, prompts as drawn) a set would
have to be for the fit to reach the paper's mean.

    python -m kvstudy +experiment=table1 regime=authors
    python bench/authors_workload_gap.py [outputs/table1/authors]
"""
import sys

import numpy as np

from kvstudy import analysis

PAPER = {"MC-SF": 32.112, "MC-Benchmark": 46.472}


def main(folder: str = "outputs/table1/authors") -> None:
    df = analysis.load_sweep(folder)
    df = df[(df["status"] == "completed") & df["algorithm"].isin(list(PAPER))]
    for name, part in df.groupby("algorithm"):
        out = np.array([analysis.requests(r)["output_tokens"].sum() for _, r in part.iterrows()], dtype=float)
        lat = part["e2e_latency.mean"].to_numpy()
        slope, icpt = np.polyfit(out, lat, 1)
        r = np.corrcoef(out, lat)[0, 1]
        need = (PAPER[name] - icpt) / slope
        print(f"{name}: mean {lat.mean():.2f} s (sd {lat.std(ddof=1):.2f}, range {lat.min():.2f}-{lat.max():.2f}) over "
              f"{len(lat)} sets; paper {PAPER[name]}; sets at or above the paper: {(lat >= PAPER[name]).sum()}; "
              f"latency vs the set's output tokens: r = {r:.2f}, {slope * 1000:.2f} s per 1,000 tokens; the fit reaches "
              f"the paper at {need:,.0f} output tokens, {100 * (need / out.mean() - 1):+.1f}% against our sets' mean "
              f"{out.mean():,.0f} (sd {out.std(ddof=1):,.0f})")


if __name__ == "__main__":
    main(*sys.argv[1:])
