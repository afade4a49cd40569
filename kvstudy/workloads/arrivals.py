"""Arrival processes (config group ``demand``): when each request reaches the scheduler."""
from __future__ import annotations

import numpy as np

from kvstudy.config.validate import check_group


def poisson(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Stationary Poisson process of ``rate`` requests per time unit starting at 0 (Sec. 5.2: high
    demand 50/s, low demand 10/s): exponential gaps, the first one included."""
    check_group("demand", {"kind": "poisson", "rate": rate})  # its bounds: kvstudy/config/schema.py
    return np.cumsum(rng.exponential(1.0 / rate, n))


def check_span(times: np.ndarray, rate: float, key: str, value: float, how: str = "") -> None:
    """Poisson arrivals of ``rate`` that reach 2**33 s, past which a time loses microseconds
    (kvstudy/workloads/requests.py ``MAX_TIME_S``): named by the ``key`` that set the rate (its ``value``; ``how``
    it made the rate), with the least value of it at which these requests arrive in time (the mean last arrival,
    n / rate, at half the bound)."""
    from kvstudy.errors import ConfigError
    from kvstudy.workloads.requests import MAX_TIME_S

    if len(times) and float(np.max(times)) >= MAX_TIME_S:
        least = 2 * len(times) / MAX_TIME_S * value / rate
        raise ConfigError(f"{key}={value:g}{how}: a Poisson rate of {rate:.3g} requests/s, at which {len(times)} "
                          f"requests arrive over {float(np.max(times)):.3g} s, past the 2**33 = {MAX_TIME_S:,} s "
                          f"that arrival times may reach; allowed: {key} >= {least:.2g} for {len(times)} requests")


def offline(n: int, rate=None, rng=None) -> np.ndarray:
    """Every request at time 0 (Arrival Model 1 of Sec. 5.1)."""
    return np.zeros(n)


PROCESSES = {"poisson": poisson, "offline": offline}


def arrivals(kind: str, n: int, rng: np.random.Generator, rate: float = None) -> np.ndarray:
    check_group("demand", {"kind": kind})  # one of PROCESSES, as kvstudy/config/schema.py declares
    return PROCESSES[kind](n, rate, rng)
