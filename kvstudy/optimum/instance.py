"""Instances in the MC-SF paper's discrete model (Sec. 2): integer arrival rounds a, prompts s, outputs o,
memory M. Generators for the synthetic study (Sec. 5.1) and validation."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvstudy.errors import DataError


@dataclass(frozen=True)
class Instance:
    arrival: np.ndarray  # integer rounds
    prompt: np.ndarray
    output: np.ndarray
    capacity: int

    def __post_init__(self) -> None:
        a, s, o = (np.asarray(x) for x in (self.arrival, self.prompt, self.output))
        if not (len(a) == len(s) == len(o)) or len(a) == 0:
            raise DataError("instance: arrival, prompt and output must be non-empty and of equal length")
        for name, arr, low in (("arrival", a, 0), ("prompt", s, 1), ("output", o, 1)):
            bad = np.flatnonzero((arr < low) | (arr != np.round(arr)))
            if len(bad):
                raise DataError(f"instance: request {int(bad[0])} has {name} {arr[bad[0]]!r}; allowed whole numbers >= {low}")
        over = np.flatnonzero(s + o > self.capacity)
        if len(over):
            i = int(over[0])
            raise DataError(f"instance: request {i} needs s + o = {int(s[i])} + {int(o[i])} = {int(s[i] + o[i])} KV tokens "
                            f"at its peak, more than M = {self.capacity}; it can never be served")

    @property
    def n(self) -> int:
        return len(self.arrival)

    def horizon(self) -> int:
        """A provably valid completion horizon: max a + sum(o + 1). In an optimal schedule no round after the
        last arrival is idle (no request active and none starting) while requests remain: otherwise every
        later start could move one round earlier, feasibly (the memory profile shifts into an empty round, all
        those requests have arrived) and strictly cheaper. Each request makes at most o + 1 rounds non-idle
        (its start round and its o active rounds), so all complete by max a + sum(o + 1)."""
        return int(np.max(self.arrival) + np.sum(self.output + 1))


def synthetic(model: int, rng: np.random.Generator) -> Instance:
    """Sec. 5.1: M ~ U[30, 50], s ~ U[1, 5], o ~ U[1, M - s]. Arrival Model 1: n ~ U[40, 60], all at round 0.
    Arrival Model 2: T ~ U[40, 60] rounds, lambda ~ U[0.5, 1.5], Poisson(lambda) arrivals in each round
    (at least one request in all: an empty draw is redrawn)."""
    M = int(rng.integers(30, 51))
    if model == 1:
        n = int(rng.integers(40, 61))
        arrival = np.zeros(n, dtype=np.int64)
    elif model == 2:
        while True:
            T = int(rng.integers(40, 61))
            lam = float(rng.uniform(0.5, 1.5))
            counts = rng.poisson(lam, T)
            if counts.sum():
                break
        arrival = np.repeat(np.arange(T), counts).astype(np.int64)
        n = len(arrival)
    else:
        raise DataError(f"arrival model {model!r}: allowed 1 or 2")
    s = rng.integers(1, 6, n)
    o = np.array([rng.integers(1, M - si + 1) for si in s], dtype=np.int64)
    return Instance(arrival, s.astype(np.int64), o, M)
