"""Compare two sweeps (or two runs) file by file: the evidence for "results unchanged" after a refactoring.

    python bench/compare_runs.py BEFORE_DIR AFTER_DIR

Every run folder (one holding summary.json) under BEFORE_DIR must exist under AFTER_DIR with the same relative
path; requests.parquet and iterations.parquet must be equal (columns, dtypes, every value; NaN equals NaN) and
summary.json equal once the wall-clock fields are dropped. Prints one line per difference and a total; exit status
1 if anything differs.
"""
import json
import sys
from pathlib import Path

import pandas as pd

WALL = {"wall_seconds", "simulate_seconds", "policy_seconds", "policy_us_per_iteration", "setup_seconds", "latency",
        "provenance"}  # provenance: the commit and versions (issue 35), not a result
#: summary keys added since (descriptions, not results): ignored when the earlier run has none
ADDED = {"kv_capacity", "hardware_note", "offered_load"}  # issue 48: how the KV capacity came about, calibration, load


def _summary(path: Path) -> dict:
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if k not in WALL}


def compare(before: Path, after: Path) -> int:
    runs = sorted(p.parent for p in before.rglob("summary.json"))
    bad = 0
    for run in runs:
        rel = run.relative_to(before)
        other = after / rel
        if not (other / "summary.json").exists():
            print(f"missing after: {rel}")
            bad += 1
            continue
        for table in ("requests.parquet", "iterations.parquet"):
            a, b = pd.read_parquet(run / table), pd.read_parquet(other / table)
            if not a.equals(b):
                print(f"{rel}/{table}: differs ({a.shape} vs {b.shape})")
                bad += 1
        a, b = _summary(run / "summary.json"), _summary(other / "summary.json")
        b = {k: v for k, v in b.items() if k in a or k not in ADDED}
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            print(f"{rel}/summary.json: differs in {keys}")
            bad += 1
    print(f"{len(runs)} runs compared, {bad} difference(s)")
    return bad


if __name__ == "__main__":
    sys.exit(1 if compare(Path(sys.argv[1]), Path(sys.argv[2])) else 0)
