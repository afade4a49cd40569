"""Load a sweep (or any folder of runs) into one tidy DataFrame: what the notebooks use.

    from kvstudy import analysis
    df = analysis.load_sweep("outputs/table1")    # one row per finished run
    df.groupby("algorithm")["e2e_latency.mean"].agg(["mean", "std", "max", "min"])
    reqs = analysis.requests(df.iloc[0])          # that run's requests.parquet, read on demand

Columns: the resolved config flattened with dots (``policy.alpha``, ``demand.name``, ``seed``, ...), the
summary flattened the same way (``e2e_latency.mean``, ``status``, ``clearing_events``, ...), ``algorithm``
(a readable label, Table 1 style) and ``folder``. Unfinished runs (no summary.json) are left out and
counted in ``df.attrs["incomplete"]``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pandas as pd
from omegaconf import OmegaConf

from kvstudy.errors import ConfigError


def _flatten(prefix: str, value: Any, out: Dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list):
        out[prefix] = json.dumps(value)
    else:
        out[prefix] = value


def algorithm_label(row: pd.Series) -> str:
    name = row.get("policy.name")
    if name == "mcsf":
        label = "MC-SF"
        if row.get("policy.margin"):
            label += f" (alpha={row['policy.margin']:g})"
    elif name == "mc_benchmark":
        label = "MC-Benchmark"
    elif name == "alpha_greedy":
        label = f"Benchmark alpha = {row['policy.alpha']:g}"
    elif name == "alpha_beta":
        label = f"Benchmark alpha = {row['policy.alpha']:g}, beta = {row['policy.beta']:g}"
    else:
        label = str(name)
    if row.get("predictor.kind") == "uniform_noise":
        label += f", eps = {row['predictor.epsilon']:g}"
    if row.get("engine.raise_prediction_on_eviction") is True:
        label += ", remedy"
    return label


def load_sweep(folder) -> pd.DataFrame:
    root = Path(folder)
    if not root.exists():
        raise ConfigError(f"{root}: no such sweep folder")
    rows, incomplete = [], 0
    for cfg_file in sorted(root.rglob("resolved_config.yaml")):
        run = cfg_file.parent
        summary_file = run / "summary.json"
        if not summary_file.exists():
            incomplete += 1
            continue
        row: Dict[str, Any] = {}
        _flatten("", OmegaConf.to_container(OmegaConf.load(cfg_file)), row)
        summary = json.loads(summary_file.read_text())
        summary.pop("latency", None)
        _flatten("", summary, row)
        row["folder"] = str(run)
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        df["algorithm"] = df.apply(algorithm_label, axis=1)
    df.attrs["incomplete"] = incomplete
    return df


def requests(row: pd.Series) -> pd.DataFrame:
    return pd.read_parquet(Path(row["folder"]) / "requests.parquet")


def iterations(row: pd.Series) -> pd.DataFrame:
    return pd.read_parquet(Path(row["folder"]) / "iterations.parquet")
