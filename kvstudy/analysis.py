"""Load a sweep (or any folder of runs) into one tidy DataFrame: what the notebooks use.

    from kvstudy import analysis
    df = analysis.load_sweep("outputs/table1")    # one row per finished run, every hardware subfolder
    df.groupby(["hardware.name", "algorithm"])["e2e_latency.mean"].agg(["mean", "std", "max", "min"])
    reqs = analysis.requests(df.iloc[0])          # that run's requests.parquet, read on demand

Columns: the resolved config flattened with dots (``policy.alpha``, ``demand.name``, ``seed``, ...), the
summary flattened the same way (``e2e_latency.mean``, ``status``, ``clearing_events``, ...), ``algorithm``
(a readable label, Table 1 style), ``regime`` (``authors`` for a ``regime=authors`` run, else its hardware) and
``folder``. Unfinished runs (no summary.json: still running, failed, or interrupted with status ``interrupted``)
are left out and counted in ``df.attrs["incomplete"]``; finished runs with another status than ``completed``
(``no_progress``, ``stalled``, ...) are kept and named in one warning.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from kvstudy.errors import ConfigError
from kvstudy.running.outputs import finished_summary


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
    cap = row.get("engine.max_batch")
    if cap is not None and cap == cap:  # set, not NaN (a column other runs of the sweep leave empty)
        label += f", B = {int(cap)}"
    return label


def load_sweep(folder) -> pd.DataFrame:
    root = Path(folder)
    if not root.exists():
        raise ConfigError(f"{root}: no such sweep folder")
    rows, incomplete = [], 0
    for cfg_file in sorted(root.rglob("resolved_config.yaml")):
        run = cfg_file.parent
        summary = finished_summary(run)
        if summary is None:  # not finished, failed, or interrupted (re-run on resume)
            incomplete += 1
            continue
        row: Dict[str, Any] = {}
        _flatten("", OmegaConf.to_container(OmegaConf.load(cfg_file)), row)
        summary.pop("latency", None)
        _flatten("", summary, row)
        row["folder"] = str(run)
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        df["algorithm"] = df.apply(algorithm_label, axis=1)
        # which regime of the MC-SF study a run belongs to: regime=authors, else its hardware
        names = df["regime.name"] if "regime.name" in df else pd.Series("none", index=df.index)
        df["regime"] = np.where(names == "authors", "authors", df.get("hardware.name", pd.Series("", index=df.index)))
    if len(df) and "cluster.per_replica" in df:  # cluster.replicas > 1 (issue 37): how evenly the replicas worked
        reps = df["cluster.per_replica"].map(lambda v: json.loads(v) if isinstance(v, str) else [])
        busy = reps.map(lambda rs: [r["busy_seconds"] for r in rs])
        df["cluster.imbalance"] = busy.map(lambda b: max(b) / np.mean(b) if b and np.mean(b) > 0 else np.nan)
    df.attrs["incomplete"] = incomplete
    if len(df) and "status" in df:
        odd = df["status"][df["status"] != "completed"].value_counts()
        if len(odd):  # finished, but not every request was served: said once, kept (the status column has it)
            warnings.warn(f"{root}: {int(odd.sum())} run(s) ended with status "
                          f"{', '.join(f'{k} ({v})' for k, v in odd.items())}; see the status and message columns",
                          stacklevel=2)
    return df


def per_replica(df: pd.DataFrame) -> pd.DataFrame:
    """One row per replica of every cluster run in ``df`` (``load_sweep``'s ``cluster.per_replica``): the run's
    ``folder`` and the replica's requests, completions, iterations, busy seconds, median e2e and TTFT, preemptions
    (and prefix hit rate with caching)."""
    rows = []
    for folder, value in zip(df["folder"], df.get("cluster.per_replica", pd.Series(dtype=object))):
        if isinstance(value, str):
            rows += [{"folder": folder, **r} for r in json.loads(value)]
    return pd.DataFrame(rows)


def requests(row: pd.Series) -> pd.DataFrame:
    return pd.read_parquet(Path(row["folder"]) / "requests.parquet")


def iterations(row: pd.Series) -> pd.DataFrame:
    return pd.read_parquet(Path(row["folder"]) / "iterations.parquet")


#: the regimes of the MC-SF study: kvstudy's default, one A100 timing all layers (issue 26), the authors' (issue 32)
REGIMES = {
    "a100_tp2": "two A100s, tensor parallel (kvstudy's default)",
    "a100_vidur_default": "one A100 timing all layers (Vidur's default replica)",
    "authors": "the authors' scripts: their batch-time formula, checks and event order (regime=authors)",
}


def service_rate(reqs: pd.DataFrame, lo: float = 0.25, hi: float = 0.75) -> float:
    """Completions per second over the middle of a run: the requests completed after the ``lo`` and up to the
    ``hi`` quantile of the completion order, over the time between those two completions (the middle leaves out
    the start-up and the drain). It depends on the order of service as much as on capacity: shortest first
    completes more requests per second from the same processed tokens (``processed_token_rate``), which is how
    Fig. 3 (Jaillet et al., Sec. 5.2.1) should be read."""
    done = reqs["completion_time"].dropna().sort_values().to_numpy()
    if len(done) < 4:
        return float("nan")
    i, j = int(lo * (len(done) - 1)), int(hi * (len(done) - 1))
    span = done[j] - done[i]
    return float((j - i) / span) if span > 0 else float("nan")


def processed_token_rate(its: pd.DataFrame) -> float:
    """Tokens processed per second of simulated time (prompt tokens of prefills plus one per decode, over
    iterations that ran; an overflowing batch's work is discarded, so it is left out): the capacity a policy
    gets out of the hardware, the quantity Fig. 4 plots per second."""
    ran = its[~its["overflow"]] if "overflow" in its else its
    end = float((its["start"] + its["duration"]).max()) if len(its) else 0.0
    return float((ran["prefill_tokens"] + ran["decode_tokens"]).sum() / end) if end > 0 else float("nan")


def overload_service_rate(mean_latency: float, num_requests: float, arrival_rate: float) -> float:
    """The service rate (requests per second) a mean latency implies under sustained overload: N requests
    arrive over N / lambda seconds and leave at mu per second, so the i-th waits about i (1/mu - 1/lambda) and
    the mean latency is L = (N / 2)(1/mu - 1/lambda), i.e. mu = 1 / (2 L / N + 1 / lambda). Applied to a slope
    s = dL/dN of Fig. 3 instead of L / N it gives mu = 1 / (2 s + 1 / lambda). It ignores service order and
    the time of one request's own processing, so it is a reading aid: when Table 1's point and Fig. 3's slope
    imply very different rates, both cannot describe one system (docs/findings.md)."""
    return 1.0 / (2.0 * mean_latency / num_requests + 1.0 / arrival_rate)


#: the study's SLOs (docs/disaggregation.md): DistServe's chatbot SLOs for its 66B model (Zhong et al. OSDI'24,
#: Table 1: TTFT 2.5 s, TPOT 0.15 s), the nearest of its settings to Llama2-70B on two A100s
TTFT_SLO, TPOT_SLO = 2.5, 0.15


def slo_attainment(reqs: pd.DataFrame, ttft_slo: float = TTFT_SLO, tpot_slo: float = TPOT_SLO) -> float:
    """The share of all requests that completed with TTFT <= ``ttft_slo`` and TPOT (mean time per output token after
    the first, requests.parquet's ``mean_tbt``; 0 for a one-token request) <= ``tpot_slo``: DistServe's SLO
    attainment (a request not served misses both)."""
    if not len(reqs):
        return float("nan")
    done = reqs["state"] == "done"
    tpot = reqs["mean_tbt"].fillna(0.0)
    return float((done & (reqs["ttft"] <= ttft_slo) & (tpot <= tpot_slo)).sum() / len(reqs))


def disaggregation_table(folder, ttft_slo: float = TTFT_SLO, tpot_slo: float = TPOT_SLO,
                         target: float = 0.9) -> pd.DataFrame:
    """The disaggregation study's table (``+experiment=disaggregation``): per policy, deployment and rate, the SLO
    attainment, TTFT p90 / p99, TBT p99 (pooled), the handoff's gap (from the first token until the KV is on the
    decode replica: the wait for its blocks and the link, and the transfer; median over handed-off requests) and the
    transfer's share of it (median of transfer seconds / gap); and per
    policy and deployment its goodput: the highest swept rate whose attainment is at least ``target`` (DistServe's
    definition; NaN: no rate reaches it), per GPU over the deployment's GPUs."""
    df = load_sweep(folder)
    rows = []
    for _, run in df.iterrows():
        reqs = requests(run)
        if "handoff_time" in reqs:  # a disaggregated run's
            handed = reqs[reqs["handoff_time"].notna()]
            # the handoff's gap: from the first token until the KV is on the decode replica (the wait for its
            # blocks, for the link, and the transfer); a free transfer admitted at once has none
            gap = handed["transfer_end"] - handed["handoff_time"]
            share = (handed["transfer_seconds"] / gap.where(gap > 0)).fillna(0.0)
        else:
            handed = gap = share = pd.Series(dtype=float)
        deployment = _layout(run)
        link = run.get("disaggregation.link")
        rows.append({"policy": run["algorithm"], "deployment": deployment, "hardware": _hardware(run),
                     "workload": _workload(run), "link": link if isinstance(link, str) else "-",
                     "rate": float(run["demand.rate"]),
                     "gpus": _gpus(run), "attainment": slo_attainment(reqs, ttft_slo, tpot_slo),
                     "ttft_p90": run.get("ttft.p90"), "ttft_p99": run.get("ttft.p99"),
                     "tbt_p99": run.get("tbt.p99"), "e2e_median": run.get("e2e_latency.median"),
                     "transfer_s_median": float(handed["transfer_seconds"].median()) if len(handed) else 0.0,
                     "transfer_share_of_handoff": float(share.median()) if len(handed) else 0.0,
                     "handoff_gap_s_median": float(gap.median()) if len(handed) else 0.0,
                     "status": run.get("status")})
    setting = ["policy", "deployment", "hardware", "workload", "link"]  # one goodput per setting, over its rates
    table = pd.DataFrame(rows).sort_values(setting + ["rate"]).reset_index(drop=True)
    good = table[table["attainment"] >= target].groupby(setting)["rate"].max()
    table["goodput_rps"] = [good.get(tuple(key), np.nan) for key in table[setting].itertuples(index=False)]
    table["goodput_per_gpu"] = table["goodput_rps"] / table["gpus"]
    return table


def _layout(run: pd.Series) -> str:
    """``p1d3`` from a run's pools (load_sweep flattens ``cluster.pools.<name>.role`` and ``.replicas``),
    ``colocated`` without."""
    count = {}
    for key in run.index:
        if key.startswith("cluster.pools.") and key.endswith(".role") and isinstance(run[key], str):
            count[run[key]] = run.get(key[:-len("role")] + "replicas")
    if "prefill" not in count:
        return "colocated"
    return f"p{int(count['prefill'])}d{int(count.get('decode', 0))}"


def _hardware(run: pd.Series) -> str:
    """The run's replicas' hardware: one option (``a100_tp2``) when all are alike; else per pool (``prefill h100_tp2 /
    decode a100_tp2``) or, for one pool of several kinds, the kinds joined by ``+``."""
    per = run.get("cluster.per_replica")
    parts = json.loads(per) if isinstance(per, str) else []
    kinds = {p.get("hardware") for p in parts} - {None}
    if len(kinds) <= 1:
        return kinds.pop() if kinds else str(run.get("hardware.name"))
    pools: dict = {}
    for p in parts:
        pools.setdefault(p.get("pool", "mixed"), []).append(p.get("hardware"))
    if len(pools) == 1:
        return "+".join(sorted(kinds))
    return " / ".join(f"{name} {'+'.join(sorted(set(hw)))}" for name, hw in pools.items())


def _workload(run: pd.Series) -> str:
    """The run's workload: its option's name, or a trace file's stem (``workload=trace``)."""
    name, path = run.get("workload.name"), run.get("workload.path")
    if name == "trace" and isinstance(path, str):
        return Path(path).stem
    return str(name)


def _gpus(run: pd.Series) -> int:
    """GPUs of the run's deployment: its replicas (cluster.per_replica, or 1) x the hardware's TP x PP."""
    per = run.get("cluster.per_replica")
    replicas = len(json.loads(per)) if isinstance(per, str) else 1
    return replicas * int(run.get("hardware.tensor_parallel", 1)) * int(run.get("hardware.pipeline_parallel", 1))
