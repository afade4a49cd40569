"""The deployment search over a grid (issue 58, item 3): every deployment a spec names, each one's capacity under the
spec's criterion (kvstudy/search/capacity.py), its cost per hour (kvstudy/search/prices.py), QPS per dollar and the
Pareto frontier of cost against latency; the best deployment under the SLO: its capacity under the criterion and, when the spec has an ``slo``, its
latencies at that capacity within it (Vidur-Search's rule: capacity by scheduling delay, then TTFT and TBT at
capacity, Agrawal et al. Sec. 6 and 7.3). A capacity criterion alone can be met in ways users do not feel as service:
a policy that admits at once and evicts later (MC-SF on paged memory) keeps scheduling delay low at rates where TTFT
is many seconds.

The spec is a YAML file like Vidur-Search's config.yml (vidur/config_optimizer/config_explorer/config/), read and
checked by ``read_spec``; why YAML and not a Hydra experiment: a search runs many searches of many simulations each,
with state to resume, so it is a program of its own over composed runs (as Vidur-Search is over Vidur's runs), not one
multirun sweep::

    overrides: [model=llama2_70b, workload=splitwise_conv, workload.num_requests=600, workload.over_context=drop,
                memory=paged, memory.capacity_tokens=auto, +demand=high]
    criterion: goodput:ttft=2.5,tpot=0.15,share=0.9
    seeds: [0]
    gpu_budget: 16
    search: {start: 1.0, tolerance: 0.05, max_rate: 64}
    slo: {ttft_p90: 2.0, tbt_p99: 0.2}              # optional: latencies at capacity a ranked deployment meets
    grid:
      hardware: [a100_tp2, a100_tp4, h100_tp2]      # options of the hardware group: device x TP
      pipeline: [1, 2]                                # pipeline stages of each co-located replica (default [1])
      replicas: [1, 2, 4]                             # co-located replicas of each
      deployments: [p1d3, p2d2, ha_p1d3]              # options of the deployment group (pools), on each hardware
      policies:                                       # each policy with its settings to try ([{}]: as shipped)
        vllm: [{}]
        sarathi: [{chunk_size: 256}, {chunk_size: 512}]

Each deployment is one set of overrides on top of ``overrides``; its GPUs are its replicas' TP x PP (a pool's own
hardware counted; ``pipeline`` applies to co-located replicas, ``hardware.pipeline_parallel``: a disaggregated
deployment's pools run at their hardware's own PP); one over ``gpu_budget`` is skipped with that reason, as is one the
first simulation refuses (a model whose weights do not fit: the run's one-line reason); one on a GPU the price table
has no price for is searched all the same, its capacity reported and its cost left empty with that reason (it is
not ranked by cost, nor on the Pareto frontier). Each finished
deployment is written to ``<out>/deployments/<key>.json`` at once (whole or not at all): a search run again finds it
there and does not search it again (resume). The table ``<out>/results.parquet`` and the figure ``<out>/pareto.png``
are written at the end. Deployments fan out through ``launcher`` (kvstudy/search/fanout.py): ``jobs`` local processes,
submitit (SLURM, or its local executor) or a Ray cluster; each deployment is one job, written as it finishes.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pandas as pd
from omegaconf import OmegaConf

from kvstudy.cluster.pools import read_pools
from kvstudy.errors import ConfigError, KvStudyError
from kvstudy.running.atomic import write_atomic, write_text_atomic
from kvstudy.search.capacity import at_capacity, check_search, deployment_capacity
from kvstudy.search.criteria import read_criterion
from kvstudy.search.fanout import fan_out
from kvstudy.search.prices import hourly_cost

#: the shipped specs (``python -m kvstudy.search grid <name>``)
SPECS = Path(__file__).with_name("specs")
SPEC_KEYS = ("overrides", "criterion", "seeds", "gpu_budget", "search", "slo", "grid")
#: latency limits a deployment must meet at its capacity to be ranked (``slo`` in a spec; Vidur-Search's what-if study
#: keeps a configuration only if its TTFT p90 <= 2 s and TBT p99 <= 0.2 s at capacity, Agrawal et al. Sec. 7.3)
SLO_KEYS = ("ttft_p90", "tbt_p99", "e2e_median")
GRID_KEYS = ("hardware", "pipeline", "replicas", "deployments", "policies")


@dataclass(frozen=True)
class Deployment:
    """One point of the grid: its name (``key``), its overrides and its replicas as (device, TP, PP)."""

    key: str
    overrides: tuple
    replicas: tuple
    hardware: str
    layout: str
    policy: str
    settings: str


@dataclass
class Spec:
    overrides: List[str]
    criterion: object
    criterion_text: str
    seeds: List[int]
    gpu_budget: int
    search: dict
    deployments: List[Deployment] = field(default_factory=list)
    slo: Dict[str, float] = field(default_factory=dict)


def _conf_dir() -> Path:
    from kvstudy.running.paths import REPO_ROOT

    return REPO_ROOT / "conf"


def _hardware(name: str, where: str) -> tuple:
    path = _conf_dir() / "hardware" / f"{name}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError(f"{where}={name!r}: unknown hardware; allowed: {', '.join(options)}")
    raw = OmegaConf.load(path)
    return str(raw.device), int(raw.tensor_parallel), int(raw.pipeline_parallel)


def _replica_hardware(option: str, where: str) -> List[Optional[str]]:
    """A deployment option's replicas, each as its hardware option (None: the run's), read as a run reads its pools
    (kvstudy/cluster/pools.py ``read_pools``)."""
    path = _conf_dir() / "deployment" / f"{option}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError(f"{where}={option!r}: unknown deployment; allowed: {', '.join(options)}")
    cluster = OmegaConf.to_container(OmegaConf.load(path)).get("cluster", {})
    pools = read_pools(cluster)
    if pools is None:
        return [None] * int(cluster.get("replicas", 1))
    return [hw for pool in pools for hw in pool.hardware]


def _settings_text(settings: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(settings.items())) or "-"


def read_spec(path) -> Spec:
    """The search's YAML (module docstring), checked: a bad key or value is one line naming the file, the key, the
    value and what is allowed."""
    path = Path(path)
    shipped = SPECS / f"{path.name}.yaml"
    if not path.is_file() and path.parent == Path(".") and shipped.is_file():
        path = shipped  # a shipped spec by its name
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in SPECS.glob("*.yaml")))
        raise ConfigError(f"{path}: no such search spec; allowed: a YAML file (docs/search.md) or a shipped one's "
                          f"name ({names})")
    raw = OmegaConf.to_container(OmegaConf.load(path))
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: not a mapping; allowed: keys {', '.join(SPEC_KEYS)}")
    unknown = [k for k in raw if k not in SPEC_KEYS]
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: not a search setting; allowed: {', '.join(SPEC_KEYS)}")
    overrides = raw.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"{path}: overrides={overrides!r}: allowed: a list of Hydra overrides (strings)")
    text = raw.get("criterion", "goodput")
    criterion = read_criterion(text, f"{path}: criterion")
    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           for s in seeds):
        raise ConfigError(f"{path}: seeds={seeds!r}: allowed: a list of whole numbers")
    budget = raw.get("gpu_budget", 8)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ConfigError(f"{path}: gpu_budget={budget!r}: allowed: a whole number of GPUs >= 1")
    search = {"start": 1.0, "tolerance": 0.05, "min_rate": 0.05, "max_rate": 256.0, "max_steps": 40,
              **(raw.get("search") or {})}
    unknown = [k for k in search if k not in ("start", "tolerance", "min_rate", "max_rate", "max_steps")]
    if unknown:
        raise ConfigError(f"{path}: search.{unknown[0]}: not a search setting; allowed: start, tolerance, min_rate, "
                          f"max_rate, max_steps")
    check_search(**search)
    grid = raw.get("grid") or {}
    unknown = [k for k in grid if k not in GRID_KEYS]
    if unknown:
        raise ConfigError(f"{path}: grid.{unknown[0]}: not a grid axis; allowed: {', '.join(GRID_KEYS)}")
    slo = raw.get("slo") or {}
    if not isinstance(slo, dict):
        raise ConfigError(f"{path}: slo={slo!r}: allowed: a mapping of {', '.join(SLO_KEYS)} to seconds")
    for key, value in slo.items():
        if key not in SLO_KEYS:
            raise ConfigError(f"{path}: slo.{key}: not a latency at capacity; allowed: {', '.join(SLO_KEYS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{path}: slo.{key}={value!r}: allowed: seconds > 0")
    spec = Spec(list(overrides), criterion, str(text), list(seeds), budget, search,
                slo={k: float(v) for k, v in slo.items()})
    spec.deployments = _deployments(grid, str(path))
    if not spec.deployments:
        raise ConfigError(f"{path}: grid: no deployment; allowed: grid.hardware with grid.replicas or "
                          f"grid.deployments, and grid.policies")
    return spec


def _deployments(grid: dict, where: str) -> List[Deployment]:
    hardware = grid.get("hardware") or []
    replicas = grid.get("replicas") or []
    layouts = grid.get("deployments") or []
    policies = grid.get("policies") or {}
    if not isinstance(policies, dict) or not policies:
        raise ConfigError(f"{where}: grid.policies={policies!r}: allowed: a mapping policy -> list of settings "
                          f"([{{}}]: as shipped)")
    stages = grid.get("pipeline") or [1]
    for name, values in (("replicas", replicas), ("pipeline", stages)):
        if not isinstance(values, list):
            raise ConfigError(f"{where}: grid.{name}={values!r}: allowed: a list of whole numbers >= 1")
        for n in values:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(f"{where}: grid.{name} has {n!r}; allowed: whole numbers >= 1")
    out = []
    for hw in hardware:
        device, tp, pp = _hardware(hw, f"{where}: grid.hardware")
        # co-located replicas at each pipeline depth (the key names it past 1, so PP=1 keys are as before)
        shapes = [(f"x{n}" + (f"-pp{k}" if k > 1 else ""),
                   ([f"cluster.replicas={n}"] if n > 1 else []) + ([f"hardware.pipeline_parallel={k}"] if k > 1 else []),
                   [(device, tp, k if k > 1 else pp)] * n) for k in stages for n in replicas]
        for layout in layouts:
            reps = [_hardware(own, f"{where}: {layout}") if own else (device, tp, pp)
                    for own in _replica_hardware(layout, f"{where}: grid.deployments")]
            shapes.append((layout, [f"+deployment={layout}"], reps))
        for (layout, extra, reps), (policy, options) in itertools.product(shapes, policies.items()):
            if not isinstance(options, list) or not options or not all(isinstance(o, dict) for o in options):
                raise ConfigError(f"{where}: grid.policies.{policy}={options!r}: allowed: a list of settings "
                                  f"mappings ([{{}}]: as shipped)")
            for settings in options:
                over = [f"hardware={hw}", f"+policy={policy}", *extra,
                        *(f"policy.{k}={v}" for k, v in sorted(settings.items()))]
                text = _settings_text(settings)
                key = f"{hw}-{layout}-{policy}-{text}".replace("=", "").replace(",", "_")
                out.append(Deployment(key, tuple(over), tuple(reps), hw, layout, policy, text))
    return out


def _search_one(spec_overrides, dep: Deployment, criterion, seeds, search, prices, budget) -> dict:
    """One deployment's record: skipped (with its reason) or its capacity, cost and latencies at capacity."""
    gpus = sum(tp * pp for _, tp, pp in dep.replicas)
    record = {"key": dep.key, "hardware": dep.hardware, "layout": dep.layout, "policy": dep.policy,
              "settings": dep.settings, "gpus": gpus, "devices": "+".join(sorted({d for d, _, _ in dep.replicas})),
              "overrides": list(dep.overrides)}
    if gpus > budget:
        return {**record, "status": "skipped", "reason": f"{gpus} GPUs over the budget of {budget}"}
    try:
        usd, unpriced = hourly_cost(dep.replicas, prices), ""
    except ConfigError as exc:  # searched all the same: its capacity is known, its cost not (not ranked by cost)
        usd, unpriced = math.nan, f"{exc}; capacity searched, not ranked by cost"
    try:
        with warnings.catch_warnings():  # each run's warnings (requests dropped, a paper's M off its GPU) once, in
            warnings.simplefilter("ignore", UserWarning)  # the deployment's first simulation, not per probe
            result = deployment_capacity(list(spec_overrides) + list(dep.overrides), criterion, seeds=seeds,
                                         **search)
    except KvStudyError as exc:  # the run refuses this deployment (weights that do not fit, ...): its one line
        return {**record, "status": "skipped", "reason": str(exc).splitlines()[0], "usd_per_hour": usd}
    status = "found" if result["found"] else result["statuses"][0]
    reason = ""
    if status == "above_range":  # it holds at max_rate: the capacity is at least that (ranked with that value)
        result["mean"] = min(s["capacity"] for s in result["searches"])
        reason = f"the criterion holds at max_rate={search['max_rate']:g}: the capacity is at least that"
    elif status == "unreachable":
        reason = f"the criterion fails at min_rate={search['min_rate']:g}: no rate serves it"
    if unpriced:
        reason = f"{reason}; {unpriced}" if reason else unpriced
    record.update(usd_per_hour=usd, status=status, reason=reason, capacity=result.get("mean"),
                  capacity_min=result.get("min"), capacity_max=result.get("max"), capacity_std=result.get("std"),
                  simulations=sum(len(s["probes"]) for s in result["searches"]),
                  search_seconds=sum(p["seconds"] for s in result["searches"] for p in s["probes"]))
    at = at_capacity(result["searches"][0]) if result["searches"] else {}
    record.update(ttft_p90=at.get("ttft_p90", math.nan), tbt_p99=at.get("tbt_p99", math.nan),
                  e2e_median=at.get("e2e_median", math.nan))
    if record["capacity"] and not unpriced:
        record["qps_per_usd_hour"] = record["capacity"] / usd
        record["usd_per_million_requests"] = usd / (record["capacity"] * 3600) * 1e6
    record["searches"] = result["searches"]
    return record


def _job(args):
    return _search_one(*args)


def run_grid(spec: Spec, out: Path, prices: Dict, jobs: int = 1, log=print, launcher: str = "local",
             options: Optional[dict] = None) -> pd.DataFrame:
    """Search every deployment of ``spec`` not already in ``out/deployments`` (resume), each a job of ``launcher``
    (kvstudy/search/fanout.py), write each as it finishes, then the table and the Pareto figure; returns the table."""
    folder = out / "deployments"
    folder.mkdir(parents=True, exist_ok=True)
    todo, done = [], []
    for dep in spec.deployments:
        path = folder / f"{_file_key(dep.key)}.json"
        if path.is_file():
            done.append(json.loads(path.read_text()))
        else:
            todo.append(dep)
    log(f"{len(spec.deployments)} deployments: {len(done)} found in {folder} (not searched again), {len(todo)} to "
        f"search")
    args = [(spec.overrides, dep, spec.criterion, spec.seeds, spec.search, prices, spec.gpu_budget) for dep in todo]
    results = fan_out(_job, args, launcher, jobs, out / "submitit", options)
    try:
        for dep, record in zip(todo, results):
            write_text_atomic(folder / f"{_file_key(dep.key)}.json",
                              json.dumps(record, indent=1, default=float) + "\n")
            shown = (f"capacity {'>= ' if record['status'] == 'above_range' else ''}{record['capacity']:.3g} req/s, "
                     f"${record['usd_per_hour']:.2f}/h" if record.get("capacity") else
                     f"{record['status']}: {record.get('reason', '')}")
            log(f"  {dep.key}: {shown}")
            done.append(record)
    except KeyboardInterrupt:  # Ctrl-C: what finished is on disk; the same command resumes from it
        log(f"interrupted: {len(done)} of {len(spec.deployments)} deployments written in {folder}; run the same "
            f"command again to go on")
        raise
    finally:
        results.close()  # the launcher's jobs not finished are cancelled
    table = results_table(done, spec.slo)
    write_atomic(out / "results.parquet", lambda tmp: table.drop(columns=["searches"], errors="ignore")
                 .to_parquet(tmp, index=False))
    pareto_figure(table, out / "pareto.png", spec.criterion_text)
    return table


def _file_key(key: str) -> str:
    """A deployment's file name: its key where it is short and plain, else a hash of it (a stable name either way)."""
    plain = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return plain if len(plain) <= 120 else hashlib.sha1(key.encode()).hexdigest()


def results_table(records: List[dict], slo: Optional[Dict[str, float]] = None) -> pd.DataFrame:
    """One row per deployment, the Pareto frontier of cost per request against TTFT p90 at capacity marked, and
    ``meets_slo``: its latencies at capacity within ``slo`` (every deployment with a capacity, without one)."""
    table = pd.DataFrame(records)
    for column in ("capacity", "usd_per_hour", "qps_per_usd_hour", "usd_per_million_requests", *SLO_KEYS):
        if column not in table:
            table[column] = math.nan
    meets = table["capacity"].notna() & (table["capacity"] > 0)
    for key, limit in (slo or {}).items():
        meets &= table[key] <= limit
    table["meets_slo"] = meets
    table["pareto"] = False
    # the frontier of the deployments that count: priced, and within the SLO at capacity when there is one
    found = table[meets & table["usd_per_hour"].notna()]
    for i, row in found.iterrows():  # not dominated: no other is at most as costly and as slow, and better in one
        cheaper = found["usd_per_million_requests"] <= row["usd_per_million_requests"]
        faster = found["ttft_p90"] <= row["ttft_p90"]
        strictly = (found["usd_per_million_requests"] < row["usd_per_million_requests"]) | \
            (found["ttft_p90"] < row["ttft_p90"])
        table.loc[i, "pareto"] = not (cheaper & faster & strictly).any()
    return table.sort_values(["usd_per_million_requests", "key"], na_position="last").reset_index(drop=True)


def best(table: pd.DataFrame) -> Optional[pd.Series]:
    """The deployment with the most requests per second per dollar-hour (the cheapest per request) under the SLO:
    its capacity under the criterion, its latencies at capacity within the spec's ``slo`` (``meets_slo``)."""
    found = table[table["capacity"].notna() & (table["capacity"] > 0) & table["qps_per_usd_hour"].notna()]
    if "meets_slo" in found:
        found = found[found["meets_slo"].astype(bool)]
    return None if found.empty else found.sort_values(["qps_per_usd_hour", "key"], ascending=[False, True]).iloc[0]


def pareto_figure(table: pd.DataFrame, path: Path, criterion: str) -> None:
    """Cost per million requests against TTFT p90 at capacity, one point per deployment, the frontier joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = table[table["capacity"].notna() & (table["capacity"] > 0) & table["usd_per_hour"].notna()]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    missed = found[~found["meets_slo"].astype(bool)] if "meets_slo" in found else found.iloc[:0]
    if len(missed):  # as Vidur's Fig. 5 shows them: present, but not on the frontier
        ax.scatter(missed["usd_per_million_requests"], missed["ttft_p90"], s=14, facecolors="none",
                   edgecolors="0.6", label="misses the SLO at capacity")
    found = found.drop(missed.index)
    for policy, part in found.groupby("policy"):
        ax.scatter(part["usd_per_million_requests"], part["ttft_p90"], label=policy, s=18)
    front = found[found["pareto"]].sort_values("usd_per_million_requests")
    ax.plot(front["usd_per_million_requests"], front["ttft_p90"], color="black", lw=0.8, label="Pareto frontier")
    for _, row in front.iterrows():
        ax.annotate(row["key"], (row["usd_per_million_requests"], row["ttft_p90"]), fontsize=6)
    ax.set_xlabel("US$ per million requests at capacity")
    ax.set_ylabel("TTFT p90 at capacity (s)")
    ax.set_title(f"deployments under {criterion}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
