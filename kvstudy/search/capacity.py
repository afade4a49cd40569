"""A deployment's capacity under an SLO (issue 58, item 2): the highest request rate at which a criterion
(kvstudy/search/criteria.py) holds, found by bisection, as Vidur-Search finds it
(vidur/config_optimizer/config_explorer/capacity_search.py: bisection over QPS until the bracket is narrower than a
set share of the rate).

How (``search_rate``): probe ``start``; while the criterion holds, double the rate (up to ``max_rate``), while it
fails, halve it (down to ``min_rate``), so that a bracket [a rate that holds, a rate that fails] is known; then bisect
until the bracket's width is at most ``tolerance`` times its lower end. The capacity is the bracket's lower end: the
true threshold lies in the bracket, at most ``tolerance`` above it. Bisection assumes the criterion holds below the
threshold and fails above it; with Poisson arrivals a run near the threshold may break that by chance, and the bracket
is then one such crossing (its width still within the tolerance). Statuses: ``found``; ``unreachable`` (it fails
even at ``min_rate``: no rate serves it); ``above_range`` (it holds at ``max_rate``: the capacity is at least that).

Uncertainty (``capacity``): the search runs once per seed (arrivals and, where the workload samples them, lengths) on
the same request count; the result gives each seed's capacity and their mean, minimum, maximum and standard deviation.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional, Sequence

from omegaconf import OmegaConf

from kvstudy.errors import ConfigError

STATUSES = ("found", "unreachable", "above_range")


@dataclass
class Probe:
    """One simulation of the search: its rate, whether the criterion held, the value it measured, the run's status,
    the seconds it took and the run's latencies (TTFT p90, TBT p99, median e2e; NaN when not measured)."""

    rate: float
    holds: bool
    value: float
    status: str = "completed"
    seconds: float = 0.0
    ttft_p90: float = math.nan
    tbt_p99: float = math.nan
    e2e_median: float = math.nan


@dataclass
class Search:
    """One search's result (module docstring): ``capacity`` (the highest rate seen to hold; None when none did),
    ``failing`` (the lowest rate seen to fail; None when none did), ``status`` and every probe in order."""

    capacity: Optional[float]
    failing: Optional[float]
    status: str
    probes: List[Probe] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"capacity": self.capacity, "failing": self.failing, "status": self.status,
                "probes": [asdict(p) for p in self.probes]}


def check_search(start: float, tolerance: float, min_rate: float, max_rate: float, max_steps: int) -> None:
    """The search's settings, each checked: one line naming the setting, its value and what is allowed."""
    for name, value in (("start", start), ("tolerance", tolerance), ("min_rate", min_rate), ("max_rate", max_rate)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"search.{name}={value!r}: allowed: a number > 0")
    if not tolerance < 1:
        raise ConfigError(f"search.tolerance={tolerance!r}: allowed: a fraction of the rate in (0, 1), e.g. 0.02")
    if not min_rate <= start <= max_rate:
        raise ConfigError(f"search.start={start!r}: allowed: min_rate ({min_rate}) <= start <= max_rate ({max_rate})")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ConfigError(f"search.max_steps={max_steps!r}: allowed: a whole number >= 1")


def search_rate(measure: Callable[[float], tuple], start: float, tolerance: float = 0.02,
                min_rate: float = 0.01, max_rate: float = 1000.0, max_steps: int = 40) -> Search:
    """The bisection of the module docstring. ``measure(rate)`` runs the deployment at ``rate`` and returns (whether
    the criterion holds, the value it measured, the run's status[, a dict of the run's latencies, ``Probe``'s
    fields]). ``max_steps`` bounds the simulations (a search that uses them all reports the bracket it has, its width
    above the tolerance)."""
    check_search(start, tolerance, min_rate, max_rate, max_steps)
    probes: List[Probe] = []

    def probe(rate: float) -> bool:
        t0 = time.perf_counter()
        holds, value, status, *more = measure(rate)
        probes.append(Probe(float(rate), bool(holds), float(value), str(status), time.perf_counter() - t0,
                            **(more[0] if more else {})))
        return bool(holds)

    low = high = None
    rate = float(start)
    if probe(rate):
        low = rate
        while high is None and len(probes) < max_steps:
            if rate >= max_rate:
                return Search(low, None, "above_range", probes)
            rate = min(rate * 2, max_rate)
            if probe(rate):
                low = rate
            else:
                high = rate
    else:
        high = rate
        while low is None and len(probes) < max_steps:
            if rate <= min_rate:
                return Search(None, high, "unreachable", probes)
            rate = max(rate / 2, min_rate)
            if probe(rate):
                low = rate
            else:
                high = rate
    if low is None or high is None:  # the steps ran out before a bracket
        return Search(low, high, "above_range" if high is None else "unreachable", probes)
    while high - low > tolerance * low and len(probes) < max_steps:
        mid = (low + high) / 2
        if probe(mid):
            low = mid
        else:
            high = mid
    return Search(low, high, "found", probes)


def summarise(searches: Sequence[Search]) -> dict:
    """The seeds' capacities (module docstring): each, and their mean, minimum, maximum and standard deviation over
    the seeds whose search found one (``found``: how many)."""
    values = [s.capacity for s in searches if s.status == "found" and s.capacity is not None]
    out = {"seeds": len(searches), "found": len(values), "capacities": [s.capacity for s in searches],
           "statuses": [s.status for s in searches]}
    if values:
        mean = sum(values) / len(values)
        out.update(mean=mean, min=min(values), max=max(values),
                   std=(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0)
    return out


def latencies(summary: dict) -> dict:
    """A run's TTFT p90, TBT p99 and median e2e from its summary (NaN where it has none)."""
    def get(metric, stat):
        value = (summary.get(metric) or {}).get(stat)
        return float(value) if value is not None else math.nan

    return {"ttft_p90": get("ttft", "p90"), "tbt_p99": get("tbt", "p99"), "e2e_median": get("e2e_latency", "median")}


def at_capacity(search: dict) -> dict:
    """The probe at a search's capacity (its latencies: the deployment's at the highest rate that held); {} when none
    held."""
    held = [p for p in search["probes"] if p["holds"] and p["rate"] == search["capacity"]]
    return held[-1] if held else {}


def deployment_capacity(overrides: Sequence[str], criterion, seeds: Sequence[int] = (0,), knob: str = "demand.rate",
                        **settings) -> dict:
    """The capacity of the deployment ``overrides`` (a run's Hydra overrides, as ``python -m kvstudy`` takes them)
    under ``criterion``, searched once per seed (``search_rate``'s ``settings``). ``knob``: the override the rate sets,
    ``demand.rate`` (Poisson arrivals: requests per second; the overrides choose a ``+demand``) or
    ``workload.rate_scale`` (a trace replayed that many times faster). Returns the searches and ``summarise``'s
    numbers."""
    from kvstudy import api

    base = list(overrides)
    if not any(o.split("=", 1)[0].lstrip("+") == "engine.progress" for o in base):
        base.append("engine.progress=false")
    searches = []
    for seed in seeds:
        # composed once per seed; each probe sets the knob on a copy (composing is ~0.3 s, as long as a small run)
        template = api.compose(base + [f"{knob}={settings.get('start', 1.0)!r}", f"seed={seed}"])

        def measure(rate: float, template=template):
            cfg = copy.deepcopy(template)
            OmegaConf.update(cfg, knob, float(rate), force_add=False)
            res, summary = api.simulate(cfg)
            if summary.get("status") == "interrupted":  # Ctrl-C inside the run: the search stops, nothing recorded
                raise KeyboardInterrupt
            holds, value = criterion.measure(res.requests)
            return holds, value, summary.get("status", "completed"), latencies(summary)

        searches.append(search_rate(measure, **settings))
    return {"criterion": repr(criterion), "knob": knob, "overrides": list(overrides),
            "searches": [s.to_dict() for s in searches], **summarise(searches)}
