"""Everything known about each Sec. 5.1 draw, combined over several study files.

Different runs of ``python -m kvstudy.optimum study`` learn different things about the same draw: a long
exact run on a few trials (``--only``), CP-SAT on the small ones, the LP bound on all. Per (model, trial) the
best known schedule is the smallest incumbent of any file and the lower bound the largest bound of any file;
MC-SF / OPT lies in [MC-SF / incumbent, MC-SF / bound], and the draw is proven optimal when some file proved
it or when the bound reaches the incumbent (objective (1) is an integer, so ceil(bound) >= incumbent suffices).

Nothing is taken on trust: every file's rows must be paper-size draws of the same seed (``cut`` 0), and with
``verify`` each trial's draw is regenerated (``study.instance``) and must match the file's n, M and MC-SF
latency, and every stored schedule (``start``, files written since it was added) must pass ``checker.check`` at
its stated latency. Files that disagree are refused with the file and trial named. A best schedule known only
as a number (older files) is flagged ``incumbent_checked=False`` rather than hidden.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Mapping, Union

import numpy as np
import pandas as pd

from kvstudy.errors import ConfigError
from kvstudy.optimum.study import has_schedule, seconds_spent  # has_schedule: re-exported

Sources = Union[Mapping[str, pd.DataFrame], Iterable[Union[str, Path]]]
COLUMNS = ("model", "trial", "n", "M", "mcsf", "incumbent", "bound", "proven_optimal")  # every study file has these


def best_known(sources: Sources, verify: bool = True, seed: int = 0) -> pd.DataFrame:
    """One row per (model, trial) seen in any source: n, M, mcsf, incumbent and the file it came from
    (among files tied on it, one that stores the schedule), incumbent_checked (that schedule is stored and passed
    the checker here; False when only a file without ``start`` holds the value, or ``verify`` is off), bound
    and its file, proven_optimal, ratio_low = mcsf / incumbent, ratio_high = mcsf / bound, files (how many
    sources hold the trial) and seconds (every method's seconds summed over all sources). A source that is an
    exact copy of an earlier one (a study file saved under a second name) is left out: it adds no schedule or
    bound, and would count its seconds and its file twice."""
    frames = _distinct(_load(sources))
    rows = []
    for label, df in frames.items():
        if df.empty:
            continue
        if "cut" in df and (df["cut"] != 0).any():
            raise ConfigError(f"combine: {label} holds draws cut to {sorted(df['cut'].unique().tolist())} requests; "
                              f"only paper-size studies (cut 0) combine")
        if "seed" in df and (df["seed"] != seed).any():
            raise ConfigError(f"combine: {label} was made with seed {sorted(df['seed'].unique().tolist())}, "
                              f"not {seed}")
        spent = seconds_spent(df)
        part = df[list(COLUMNS)].copy()
        part["spent"] = spent
        part["source"] = label
        part["start"] = df["start"] if "start" in df else None
        rows.append(part)
    if not rows:
        raise ConfigError("combine: no study rows in the sources given")
    allrows = pd.concat(rows, ignore_index=True)
    out = []
    for (model, trial), g in allrows.groupby(["model", "trial"], sort=True):
        for field in ("n", "M", "mcsf"):
            if g[field].nunique() > 1:
                raise ConfigError(f"combine: model {model} trial {trial}: the sources disagree on {field} "
                                  f"({dict(zip(g['source'], g[field]))}); they are not the same draw")
        if verify:
            _verify(int(model), int(trial), g, seed)
        best = g[g["incumbent"] == g["incumbent"].min()]
        stored = best["start"].map(has_schedule)
        inc = best[stored].iloc[0] if stored.any() else best.iloc[0]  # a re-checked schedule over a bare number
        bnd = g.loc[g["bound"].idxmax()]
        incumbent, bound = int(inc["incumbent"]), float(bnd["bound"])
        if bound > incumbent + 1e-6:
            raise ConfigError(f"combine: model {model} trial {trial}: bound {bound} from {bnd['source']} exceeds "
                              f"the schedule of latency {incumbent} from {inc['source']}; one of them is wrong")
        proven = bool(g["proven_optimal"].any()) or math.ceil(bound - 1e-6) >= incumbent
        if proven:
            bound = float(incumbent)
        mcsf = int(g["mcsf"].iloc[0])
        out.append({"model": int(model), "trial": int(trial), "n": int(g["n"].iloc[0]), "M": int(g["M"].iloc[0]),
                    "mcsf": mcsf, "incumbent": incumbent, "incumbent_from": inc["source"],
                    "incumbent_checked": bool(verify and has_schedule(inc["start"])), "bound": bound,
                    "bound_from": bnd["source"], "proven_optimal": proven, "ratio_low": mcsf / incumbent,
                    "ratio_high": mcsf / bound if bound > 0 else np.inf, "files": len(g),
                    "seconds": float(g["spent"].sum())})
    return pd.DataFrame(out)


def _distinct(frames: dict) -> dict:
    """``frames`` without those equal (same columns, rows and values, schedules included) to an earlier one."""
    kept = {}
    for label, df in frames.items():
        if not any(df.equals(other) for other in kept.values()):
            kept[label] = df
    return kept


def _load(sources: Sources) -> dict:
    if isinstance(sources, Mapping):
        return dict(sources)
    frames = {}
    for path in sources:
        path = Path(path)
        try:
            frames[path.name] = pd.read_parquet(path)
        except Exception as exc:
            raise ConfigError(f"combine: cannot read {path} as a study file ({type(exc).__name__}: {exc})") from None
        missing = [c for c in COLUMNS if c not in frames[path.name].columns]
        if missing:
            raise ConfigError(f"combine: {path} has no column(s) {missing}; is it a kvstudy.optimum study file?")
    return frames


def _verify(model: int, trial: int, g: pd.DataFrame, seed: int) -> None:
    from kvstudy.optimum.checker import check
    from kvstudy.optimum.online import starts
    from kvstudy.optimum.study import instance
    from kvstudy.policies.mcsf import MCSF

    inst = instance(model, trial, seed)
    row = g.iloc[0]
    if (inst.n, inst.capacity) != (int(row["n"]), int(row["M"])):
        raise ConfigError(f"combine: model {model} trial {trial} in {row['source']} has n={row['n']}, M={row['M']}; "
                          f"the seed-{seed} draw has n={inst.n}, M={inst.capacity}")
    mcsf = check(inst, starts(inst, MCSF()))
    if mcsf != int(row["mcsf"]):
        raise ConfigError(f"combine: model {model} trial {trial} in {row['source']}: MC-SF {row['mcsf']}, "
                          f"recomputed {mcsf}")
    for r in g.itertuples():
        if has_schedule(r.start):
            try:
                value = check(inst, np.asarray(r.start, dtype=np.int64))
            except Exception as exc:  # InfeasibleSchedule, wrong length: name the file, not the checker's line
                raise ConfigError(f"combine: model {model} trial {trial} in {r.source}: stored schedule "
                                  f"rejected by the checker ({exc})") from None
            if value != int(r.incumbent):
                raise ConfigError(f"combine: model {model} trial {trial} in {r.source}: stored schedule has "
                                  f"latency {value}, the file says {r.incumbent}")


__all__ = ["best_known", "has_schedule"]
