"""Arrival processes (config group ``demand``): when each request reaches the scheduler."""
from __future__ import annotations

import numpy as np

from kvstudy.config.validate import check_group


def poisson(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Stationary Poisson process of ``rate`` requests per time unit starting at 0 (Sec. 5.2: high
    demand 50/s, low demand 10/s): exponential gaps, the first one included."""
    check_group("demand", {"kind": "poisson", "rate": rate})  # its bounds: kvstudy/config/schema.py
    return np.cumsum(rng.exponential(1.0 / rate, n))


def offline(n: int, rate=None, rng=None) -> np.ndarray:
    """Every request at time 0 (Arrival Model 1 of Sec. 5.1)."""
    return np.zeros(n)


PROCESSES = {"poisson": poisson, "offline": offline}


def arrivals(kind: str, n: int, rng: np.random.Generator, rate: float = None) -> np.ndarray:
    check_group("demand", {"kind": kind})  # one of PROCESSES, as kvstudy/config/schema.py declares
    return PROCESSES[kind](n, rate, rng)
