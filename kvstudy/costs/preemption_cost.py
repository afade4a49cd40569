"""Swap vs recompute cost of preempting a request holding S KV tokens (CacheOPT, Shen et al. Sec. 3.5).

* Recompute: re-running the prefill of S tokens, timed by the run's latency model (Vidur), in chunks of
  at most the trained chunk size (each chunk attends to the ones before it).
* Swap: the request's KV out to host memory and back, timed by the run's swap model (config group
  ``swap``, ``kvstudy/costs/swap_models.py``). ``pcie`` (default): PCIe 4.0 x16, every GPU moving its own
  tensor-parallel shard at the same time, ``2 * (S * kv_bytes_per_token_per_gpu / (pcie_gbps * efficiency)
  + layers * per_layer_overhead)``, efficiency 0.8 (pinned-memory copies reach ~25 GB/s of the 31.5 GB/s
  Gen4 x16 link) and 10 us per layer and direction. ``vllm_blocks``: vLLM V0's copy per block of
  ``memory.block_size`` tokens (default 16), rate fitted to vLLM PR 11531's measurements.

CacheOPT's regressors are then fitted with scikit-learn to samples of both:

    L_r(S) = alpha_r * S^beta_r + kappa_r * S + eps_r   (beta_r by grid search, the rest least squares)
    L_s(S) = gamma_s * S + delta_s

and the sweet spot S_s solves L_r(S) = L_s(S): swap above it, recompute below (CacheOPT O4; they
measured ~4,000 tokens for OPT-13B on an A100, Fig. 8).

The command ``python -m kvstudy.preemption_cost model=opt_13b hardware=a100_tp1 [swap=vllm_blocks]`` (kvstudy/preemption_cost.py)
prints the fit and writes a plot; this module is the library it and CacheOPT's set-up (kvstudy/cacheopt/setup.py) call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from sklearn.linear_model import LinearRegression

from kvstudy.costs.arch import ModelArch
from kvstudy.latency.tables import HardwareSpec
from kvstudy.costs.swap_models import PcieSwap, SwapModel

def swap_seconds(arch: ModelArch, hw: HardwareSpec, tokens, model: Optional[SwapModel] = None,
                 block_size: int = 16) -> np.ndarray:
    """Out and back for requests of ``tokens`` KV tokens; ``model`` None: the PCIe model, token-granular."""
    if model is None:
        model, block_size = PcieSwap(), 1
    model.bind(arch, hw, block_size)
    return np.array([2.0 * model.seconds(-(-int(s) // block_size)) for s in np.atleast_1d(tokens)])


def recompute_seconds(latency, tokens: int, max_chunk: int) -> float:
    total, done = 0.0, 0
    while done < tokens:
        chunk = min(max_chunk, tokens - done)
        total += latency.iteration_seconds([(chunk, done)], 0, 0)
        done += chunk
    return total


@dataclass
class PreemptionCost:
    """Fitted CacheOPT regressors; ``choose(S)`` is the cheaper strategy for S tokens."""
    alpha_r: float
    beta_r: float
    kappa_r: float
    eps_r: float
    gamma_s: float
    delta_s: float
    sweet_spot: Optional[float]
    fit_mape_pct: dict

    def recompute(self, tokens) -> np.ndarray:
        s = np.asarray(tokens, float)
        return self.alpha_r * s ** self.beta_r + self.kappa_r * s + self.eps_r

    def swap(self, tokens) -> np.ndarray:
        return self.gamma_s * np.asarray(tokens, float) + self.delta_s

    def choose(self, tokens: int) -> str:
        return "swap" if self.swap(tokens) < self.recompute(tokens) else "recompute"


def fit(sizes: np.ndarray, recompute: np.ndarray, swap: np.ndarray) -> PreemptionCost:
    s = np.asarray(sizes, float)
    best = None
    for beta in np.linspace(1.01, 3.0, 200):
        X = np.column_stack([s ** beta, s])
        reg = LinearRegression(positive=True).fit(X, recompute)
        err = float(np.mean((reg.predict(X) - recompute) ** 2))
        if best is None or err < best[0]:
            best = (err, beta, reg)
    _, beta, reg = best
    lin = LinearRegression().fit(s[:, None], swap)
    cost = PreemptionCost(alpha_r=float(reg.coef_[0]), beta_r=float(beta), kappa_r=float(reg.coef_[1]),
                          eps_r=float(reg.intercept_), gamma_s=float(lin.coef_[0]), delta_s=float(lin.intercept_),
                          sweet_spot=None, fit_mape_pct={})
    cost.fit_mape_pct = {"recompute": float(np.mean(np.abs(cost.recompute(s) / recompute - 1)) * 100),
                         "swap": float(np.mean(np.abs(cost.swap(s) / swap - 1)) * 100)}
    grid = np.arange(1, int(s.max()) * 4 + 1, dtype=float)
    diff = cost.recompute(grid) - cost.swap(grid)
    # the first length where the cheaper strategy changes, in either direction (CacheOPT's O4 has recompute
    # cheaper below and swap above; a slow copy path can give the reverse)
    crossing = np.flatnonzero(np.sign(diff[:-1]) != np.sign(diff[1:]))
    cost.sweet_spot = float(grid[crossing[0] + 1]) if len(crossing) else None
    return cost


def measure(latency, arch: ModelArch, hw: HardwareSpec, max_tokens: int, max_chunk: int, points: int = 40,
            swap: Optional[SwapModel] = None, block_size: int = 16):
    sizes = np.unique(np.linspace(16, max_tokens, points).astype(int))
    rec = np.array([recompute_seconds(latency, int(n), max_chunk) for n in sizes])
    return sizes, rec, swap_seconds(arch, hw, sizes, swap, block_size)
