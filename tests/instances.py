"""Small random instances of the MC-SF paper's model for exact-method tests."""
import numpy as np

from kvstudy.optimum.instance import Instance


def tiny(seed: int, n: int = 3, memory=(6, 10), prompt_max: int = 2, arrival_max: int = 3) -> Instance:
    """n requests, M uniform in [memory), s in [1, prompt_max], o in [1, M - s], sorted arrivals below arrival_max."""
    rng = np.random.default_rng(seed)
    M = int(rng.integers(*memory))
    s = rng.integers(1, prompt_max + 1, n)
    o = np.array([rng.integers(1, M - si + 1) for si in s])
    return Instance(np.sort(rng.integers(0, arrival_max, n)), s, o, M)
