"""The CacheOPT study's tables from its sweeps (experiments cacheopt_main / _ablation / _sensitivity; notebook 04).

    from kvstudy.cacheopt import study
    m = study.metrics("outputs/cacheopt/opt_13b_a100_tp1/main")   # one row per run
    study.ratios(m)                                               # baseline / CacheOPT per trace and rate
    study.sustainable(m)                                          # highest rate at the latency target, per system

Per run (kvstudy/cacheopt/slo.py): p99 and p95 TTFT; tail TBT two ways: the p99 and p95 of every gap between consecutive
tokens of every request, pooled (``tbt_p99``, spec B8.11; the engine's ``tbt_pooled`` summary), and of each
request's worst gap (``worst_gap_p99``); TTFT and TBT SLO attainment, normalized latency, mean preemptions, waiting /
execution / preemption time, how full the KV cache was (``kv_used``, ``kv_full_time``: the paper's premise), and the
scheduler's wall time per iteration (Sec. 5.3). A CacheOPT run (or variant) is scored against the per-request SLOs it drew
(``slo_ttft`` / ``slo_tbt`` in its requests table, spec B8.12); a baseline against those of the run of
``scored_by`` (``cacheopt``: the literal calibration; ``cacheopt_sec34``: Sec. 3.4's, issue 33) of the same
(model, trace, rate, seed); the ablation variants draw the same SLOs as the full policy (same reference, same seed).
A setting without that run has no attainment for its baselines.

Sustainable rate (Sec. 5.1, "while maintaining similar latencies", spec B5) [D]: per (model, trace) the target is
``target_factor`` (2) x the lowest mean normalized latency any system reaches at the lowest rate; each system's
sustainable rate is where its mean normalized latency crosses the target (kvstudy.cacheopt.slo.sustainable_rate,
interpolated; the highest rate measured if it never does, which makes the ratio a lower bound).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvstudy import analysis
from kvstudy.cacheopt import slo

SETTING = ["model.name", "hardware.name", "workload.name", "demand.scale", "seed"]


def metrics(folder, scored_by: str = "cacheopt") -> pd.DataFrame:
    """One row per finished run of a CacheOPT-study folder, with the metrics above; baselines are scored against
    the SLOs of ``scored_by``'s run of their setting."""
    runs = analysis.load_sweep(folder)
    if not len(runs):
        return pd.DataFrame()
    # CacheOPT first (then its variants, then the baselines), so that each setting's SLOs are known when a baseline
    # of that setting is scored, and every requests table is read once
    name = runs["policy.name"].astype(str)
    first = np.where(name == scored_by, 0, np.where(name.str.startswith("cacheopt"), 1, 2))
    slos, rows = {}, {}
    for pos in np.argsort(first, kind="stable"):
        r = runs.iloc[pos]
        req = analysis.requests(r).sort_values("request_id")
        row = {k.split(".")[0] if k != "demand.scale" else "scale": r[k] for k in SETTING}
        row.update({"system": r["policy.name"], "rate": float(r["demand.rate"]) * float(r["demand.scale"]),
                    "status": r["status"], "folder": r["folder"],
                    "policy_us_per_iteration": r.get("policy_us_per_iteration", np.nan),
                    "tbt_p99": r.get("tbt_pooled.p99", np.nan), "tbt_p95": r.get("tbt_pooled.p95", np.nan),
                    "iterations": r.get("iterations", np.nan)})
        for k in r.index:  # the knobs a sensitivity sweep varies
            if k.startswith("policy.") or k == "memory.block_size":
                row[k] = r[k]
        row.update(slo.tails(req))
        if "estimated_output_tokens" in req:
            row.update(provisioning(req["estimated_output_tokens"], req["output_tokens"]))
        row.update(slo.time_split(req))
        row.update(kv_use(analysis.iterations(r)))
        key = tuple(r[k] for k in SETTING)
        if "slo_ttft" in req and r["policy.name"] == scored_by:  # the SLOs the baselines of this setting face
            slos.setdefault(key, req)
        ref = req if "slo_ttft" in req else slos.get(key)
        if ref is not None and len(ref) == len(req) and (ref["request_id"].to_numpy() == req["request_id"].to_numpy()).all():
            row["ttft_attainment"], row["tbt_attainment"] = slo.attainment(req, ref["slo_ttft"].to_numpy(),
                                                                           ref["slo_tbt"].to_numpy())
        rows[pos] = row
    out = pd.DataFrame([rows[pos] for pos in sorted(rows)])
    out.attrs["incomplete"] = runs.attrs.get("incomplete", 0)
    return out


def kv_use(its: pd.DataFrame, full: float = 0.95) -> dict:
    """How full the KV cache was (the paper's premise, its Fig. 4: "all systems fully allocate the KVC"): the
    time-weighted mean share of GPU blocks held (in use or reserved), and the share of time with at least ``full``
    of them held."""
    if not len(its) or "blocks_used" not in its:
        return {"kv_used": np.nan, "kv_full_time": np.nan}
    held = its["blocks_used"] / (its["blocks_used"] + its["blocks_free"])
    w = its["duration"].to_numpy(dtype=float)
    total = w.sum()
    if total <= 0:
        return {"kv_used": np.nan, "kv_full_time": np.nan}
    return {"kv_used": float((held * w).sum() / total), "kv_full_time": float(w[(held >= full).to_numpy()].sum() / total)}


def provisioning(estimate, truth) -> dict:
    """Over- and under-provisioned requests (share) and their mean deviation in tokens (Fig. 17h, Fig. 5)."""
    e, t = np.asarray(estimate, dtype=float), np.asarray(truth, dtype=float)
    over, under = e > t, e < t
    return {"over_share": float(over.mean()), "under_share": float(under.mean()),
            "over_tokens": float((e - t)[over].mean()) if over.any() else 0.0,
            "under_tokens": float((t - e)[under].mean()) if under.any() else 0.0}


def means(m: pd.DataFrame) -> pd.DataFrame:
    """Mean over seeds per (model, hardware, trace, scale, system), with the number of seeds."""
    keys = ["model", "hardware", "workload", "scale", "rate", "system"]
    g = m.groupby(keys, dropna=False)
    out = g.mean(numeric_only=True).drop(columns=["seed"], errors="ignore")
    out["seeds"] = g.size()
    return out.reset_index()


def interval(values) -> float:
    """Half-width of a 95% t interval of the mean over seeds (0 for one seed)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return 0.0
    from scipy import stats

    return float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


def with_intervals(m: pd.DataFrame, col: str) -> pd.DataFrame:
    """``col`` as "mean ± 95% half-width over seeds" per (trace, rate) and system."""
    g = m.groupby(["workload", "rate", "system"])[col]
    out = g.mean().map("{:.3g}".format) + " ± " + g.agg(interval).map("{:.2g}".format)
    return out.unstack("system")


def ratios(m: pd.DataFrame, reference: str = "cacheopt", baselines=None) -> pd.DataFrame:
    """Per (model, trace, rate, baseline): tail TTFT, tail TBT (pooled gaps) and tail worst gap of the baseline / of
    CacheOPT (> 1: CacheOPT's is lower), and CacheOPT's attainment minus the baseline's, from seed means."""
    mm = means(m)
    rows = []
    for key, part in mm.groupby(["model", "hardware", "workload", "scale", "rate"]):
        part = part.set_index("system")
        if reference not in part.index:
            continue
        ref = part.loc[reference]
        for b in part.index:
            if b == reference or (baselines is not None and b not in baselines):
                continue
            x = part.loc[b]
            rows.append(dict(zip(["model", "hardware", "workload", "scale", "rate"], key), baseline=b,
                             ttft_p99_ratio=x["ttft_p99"] / ref["ttft_p99"],
                             worst_gap_p99_ratio=x["worst_gap_p99"] / ref["worst_gap_p99"],
                             ttft_p95_ratio=x["ttft_p95"] / ref["ttft_p95"],
                             tbt_p99_ratio=x["tbt_p99"] / ref["tbt_p99"], tbt_p95_ratio=x["tbt_p95"] / ref["tbt_p95"],
                             worst_gap_p95_ratio=x["worst_gap_p95"] / ref["worst_gap_p95"],
                             ttft_attainment_gain=ref.get("ttft_attainment", np.nan) - x.get("ttft_attainment", np.nan),
                             tbt_attainment_gain=ref.get("tbt_attainment", np.nan) - x.get("tbt_attainment", np.nan),
                             normalized_latency_ratio=x["normalized_latency"] / ref["normalized_latency"]))
    return pd.DataFrame(rows)


def sustainable(m: pd.DataFrame, target_factor: float = 2.0) -> pd.DataFrame:
    """Per (model, trace, system): the sustainable rate at the normalized-latency target (module docstring)."""
    mm = means(m)
    rows = []
    for key, part in mm.groupby(["model", "hardware", "workload"]):
        lowest = part["rate"].min()
        target = target_factor * part.loc[part["rate"] == lowest, "normalized_latency"].min()
        for system, s in part.groupby("system"):
            s = s.sort_values("rate")
            rate = slo.sustainable_rate(s["rate"].to_numpy(), s["normalized_latency"].to_numpy(), target)
            rows.append(dict(zip(["model", "hardware", "workload"], key), system=system, target=target,
                             sustainable_rate=rate,
                             capped=bool(np.isfinite(rate) and rate >= s["rate"].max() - 1e-12)))
    out = pd.DataFrame(rows)
    if len(out):
        ref = out[out["system"] == "cacheopt"].set_index(["model", "hardware", "workload"])["sustainable_rate"]
        out["cacheopt_over_this"] = [ref.get((a, b, c), np.nan) / r if r else np.nan
                                     for a, b, c, r in out[["model", "hardware", "workload", "sustainable_rate"]].itertuples(index=False)]
    return out


def ablation_table(m: pd.DataFrame) -> pd.DataFrame:
    """Per variant, averaged over traces and seeds, as Sec. 5.2 reports it: how much better the full CacheOPT's
    tail TTFT / TBT (pooled gaps; and worst gap) is than the variant's (percent of the variant's) and how much lower the variant's attainments are
    (percent of the full policy's)."""
    mm = means(m)
    rows = []
    for key, part in mm.groupby(["model", "hardware", "workload", "scale"]):
        part = part.set_index("system")
        if "cacheopt" not in part.index:
            continue
        full = part.loc["cacheopt"]
        for v in part.index:
            if v == "cacheopt":
                continue
            x = part.loc[v]
            rows.append(dict(zip(["model", "hardware", "workload", "scale"], key), variant=v.replace("cacheopt_wo_", "/").upper(),
                             tail_ttft_better_pct=100 * (1 - full["ttft_p99"] / x["ttft_p99"]),
                             tail_tbt_better_pct=100 * (1 - full["tbt_p99"] / x["tbt_p99"]),
                             worst_gap_better_pct=100 * (1 - full["worst_gap_p99"] / x["worst_gap_p99"]),
                             ttft_attainment_drop_pct=100 * (1 - x["ttft_attainment"] / full["ttft_attainment"]),
                             tbt_attainment_drop_pct=100 * (1 - x["tbt_attainment"] / full["tbt_attainment"])
                             if full["tbt_attainment"] else np.nan,
                             overhead_less_pct=100 * (1 - x["policy_us_per_iteration"] / full["policy_us_per_iteration"])))
    return pd.DataFrame(rows)


def study_folder(results, model: str, hardware: str, kind: str) -> Path:
    return Path(results) / "cacheopt" / f"{model}_{hardware}" / kind
