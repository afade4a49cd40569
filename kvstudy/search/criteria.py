"""What a run must meet for its request rate to count as served (issue 58): each criterion reads a finished run's
requests table (requests.parquet's columns) and says whether it holds and the value it measured.

* ``SchedulingDelay``: Vidur-Search's (vidur/config_optimizer/config_explorer/capacity_search.py): a quantile of the
  scheduling delay (first scheduled - arrival) at most a value, in seconds;
* ``Goodput``: DistServe's (Zhong et al. OSDI'24, Sec. 2): the share of requests that finish with TTFT and TPOT
  within their SLOs is at least ``share`` (``kvstudy.analysis.slo_attainment``; a request not served misses);
* ``Latency``: a quantile of TTFT or e2e latency at most a value.

A criterion is written ``name:key=value,...`` where a string is easier (the search's YAML, the command line):
``scheduling_delay:quantile=0.99,seconds=2``, ``goodput:ttft=2.5,tpot=0.15,share=0.9``,
``latency:metric=ttft,quantile=0.9,seconds=1``; ``read_criterion`` checks it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Dict, Tuple

import pandas as pd

from kvstudy.errors import ConfigError


def _quantile(values: pd.Series, q: float) -> float:
    return float(values.quantile(q)) if len(values) else float("inf")


@dataclass(frozen=True)
class SchedulingDelay:
    """Vidur-Search's criterion: the ``quantile`` of scheduling delay <= ``seconds``; a request never scheduled
    counts as an infinite delay."""

    quantile: float = 0.99
    seconds: float = 2.0

    def measure(self, requests: pd.DataFrame) -> Tuple[bool, float]:
        delay = (requests["first_scheduled_time"] - requests["arrival_time"]).fillna(float("inf"))
        value = _quantile(delay, self.quantile)
        return value <= self.seconds, value


@dataclass(frozen=True)
class Goodput:
    """DistServe's criterion: SLO attainment (TTFT <= ``ttft`` and TPOT <= ``tpot``, seconds) >= ``share``."""

    ttft: float = 2.5
    tpot: float = 0.15
    share: float = 0.9

    def measure(self, requests: pd.DataFrame) -> Tuple[bool, float]:
        from kvstudy.analysis import slo_attainment

        value = slo_attainment(requests, self.ttft, self.tpot)
        return value >= self.share, value


@dataclass(frozen=True)
class Latency:
    """A quantile of ``metric`` (``ttft`` or ``e2e``) <= ``seconds``; a request not served counts as infinite."""

    metric: str = "ttft"
    quantile: float = 0.9
    seconds: float = 1.0

    def measure(self, requests: pd.DataFrame) -> Tuple[bool, float]:
        column = {"ttft": "ttft", "e2e": "e2e_latency"}[self.metric]
        served = requests[column].where(requests["state"] == "done")
        value = _quantile(served.fillna(float("inf")), self.quantile)
        return value <= self.seconds, value


CRITERIA: Dict[str, type] = {"scheduling_delay": SchedulingDelay, "goodput": Goodput, "latency": Latency}


def read_criterion(text: str, key: str = "criterion"):
    """``name:key=value,...`` (module docstring) as a criterion; a bad one is one line naming ``key``, the value and
    what is allowed."""
    name, _, rest = str(text).partition(":")
    kind = CRITERIA.get(name.strip())
    if kind is None:
        raise ConfigError(f"{key}={text!r}: unknown criterion {name!r}; allowed: {', '.join(CRITERIA)} "
                          f"(e.g. scheduling_delay:quantile=0.99,seconds=2)")
    allowed = {f.name: f.type for f in fields(kind)}
    values = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        field, eq, raw = part.partition("=")
        field = field.strip()
        if not eq or field not in allowed:
            raise ConfigError(f"{key}={text!r}: {part!r} is not a setting of {name}; allowed: "
                              f"{', '.join(f'{f}=...' for f in allowed)}")
        if field == "metric":
            if raw.strip() not in ("ttft", "e2e"):
                raise ConfigError(f"{key}={text!r}: metric={raw.strip()!r}; allowed: ttft, e2e")
            values[field] = raw.strip()
            continue
        try:
            number = float(raw)
        except ValueError:
            raise ConfigError(f"{key}={text!r}: {field}={raw.strip()!r} is not a number") from None
        if field in ("quantile", "share") and not 0.0 < number <= 1.0:
            raise ConfigError(f"{key}={text!r}: {field}={number:g}; allowed: a fraction in (0, 1]")
        if field not in ("quantile", "share") and not (number > 0.0 and math.isfinite(number)):
            raise ConfigError(f"{key}={text!r}: {field}={number:g}; allowed: seconds > 0 (finite)")
        values[field] = number
    return kind(**values)
