"""Studies that are searches rather than grids.

``python -m kvstudy.studies alpha-search +demand=high [hardware=a100_vidur_default seed=0 ... out=DIR]``

Writes ``outputs/alpha_search/<hardware>/<demand>.json`` (``regime=authors``: ``outputs/alpha_search/authors/``;
``out=DIR``: ``DIR/<demand>.json``).

Smallest alpha for which alpha-protection greedy terminates (Jaillet et al., Sec. 5.2.1: a grid search with
step 0.01; the paper found 0.21 for high demand and 0.24 for low). alpha is scanned upward from 0.01; a run
"terminates" when it completes every request; one that cycles through clearing events without completing a
request ends with status ``no_progress`` (engine.stall_limit). The statuses of the whole scan are printed,
because termination need not be monotone in alpha.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List

import numpy as np

from kvstudy import api
from kvstudy.running.atomic import write_text_atomic
from kvstudy.running.paths import prepare_dir, prepare_file
from kvstudy.errors import cli_entry


def alpha_search(overrides: List[str], start: float = 0.01, stop: float = 0.5, step: float = 0.01):
    rows = []
    for alpha in np.round(np.arange(start, stop + 1e-9, step), 4):
        cfg = api.compose(["+policy=alpha_greedy", f"policy.alpha={alpha}", "engine.progress=false"] + overrides)
        _, summary = api.simulate(cfg)
        rows.append((float(alpha), summary["status"], summary["clearing_events"], summary["e2e_latency"]["mean"]))
        if summary["status"] == "completed":
            break
    return rows


@cli_entry
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "alpha-search":
        print("usage: python -m kvstudy.studies alpha-search +demand=high [overrides]", file=sys.stderr)
        return 2
    out_dir = None
    overrides = []
    for arg in argv[1:]:
        if arg.startswith("out="):
            out_dir = Path(arg.split("=", 1)[1])
        else:
            overrides.append(arg)
    cfg = api.compose(["+policy=alpha_greedy"] + overrides)
    demand = cfg.get("demand")
    name = demand.name if demand is not None else "trace"
    given = out_dir is not None
    if out_dir is None:
        out_dir = Path("outputs/alpha_search") / str(cfg.regime.folder)
    # the output checked and its folder made before the scan (kvstudy/running/paths.py): one line for any mistake
    prepare_dir(out_dir, "out" if given else None, fix="choose another folder (out=DIR)")
    prepare_file(out_dir / f"{name}.json", fix="choose another folder (out=DIR)")
    rows = alpha_search(overrides)
    for alpha, status, clearing, mean in rows:
        print(f"alpha={alpha:.2f}  {status:12s} clearing events {clearing:4d}  mean e2e {mean if mean is None else round(mean, 2)}")
    done = [r for r in rows if r[1] == "completed"]
    print(f"smallest terminating alpha: {done[0][0]:.2f}" if done else "no alpha in the scan terminated")
    record = {"overrides": overrides, "smallest_terminating_alpha": done[0][0] if done else None,
              "rows": [{"alpha": a, "status": st, "clearing_events": c, "mean_e2e": m} for a, st, c, m in rows]}
    write_text_atomic(out_dir / f"{name}.json", json.dumps(record, indent=1) + "\n")
    print(f"wrote {out_dir / (name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
