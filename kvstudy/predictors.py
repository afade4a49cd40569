"""Output-length predictors (config group ``predictor``): what policies see instead of the truth.

* ``oracle``: the true output length (Sec. 5.2 main experiments).
* ``uniform_noise``: o^ ~ U((1 - eps) o, (1 + eps) o), rounded, at least 1 (Sec. 5.2.2).
* ``trace``: the trace's own ``predicted_output_tokens`` column.
* ``gaussian_noise``: o^ = round(o + N(0, sigma^2)) clamped to [low, high] (RR-SJF paper Sec. 3.5: [1, 1024];
  the authors' ``add_noise.py`` clamps to [15, 1025], a setting). Only the policy's ordering sees it.
"""
from __future__ import annotations

import numpy as np

from kvstudy.errors import ConfigError, DataError
from kvstudy.workloads.requests import Requests


def oracle(requests: Requests, rng: np.random.Generator) -> np.ndarray:
    return requests.output_tokens.copy()


def uniform_noise(requests: Requests, rng: np.random.Generator, epsilon: float = 0.2) -> np.ndarray:
    if not 0 <= epsilon < 1:
        raise ConfigError(f"predictor.epsilon={epsilon}: allowed 0 <= epsilon < 1")
    o = requests.output_tokens.astype(float)
    return np.maximum(1, np.rint(rng.uniform((1 - epsilon) * o, (1 + epsilon) * o))).astype(np.int64)


def from_trace(requests: Requests, rng: np.random.Generator) -> np.ndarray:
    if requests.predicted_output_tokens is None:
        raise DataError("predictor=trace needs a 'predicted_output_tokens' column in the trace "
                        "(or map one with workload.columns.predicted_output_tokens=NAME)")
    return requests.predicted_output_tokens.copy()


def gaussian_noise(requests: Requests, rng: np.random.Generator, sigma: float = 0.0, low: int = 1,
                   high: int = 1024) -> np.ndarray:
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not sigma >= 0:
        raise ConfigError(f"predictor.sigma={sigma!r}: must be a number >= 0 (tokens)")
    if not isinstance(low, int) or not isinstance(high, int) or not 1 <= low <= high:
        raise ConfigError(f"predictor.low={low!r}, predictor.high={high!r}: integers with 1 <= low <= high")
    o = requests.output_tokens.astype(float)
    noisy = np.rint(o + rng.normal(0.0, float(sigma), len(o))) if sigma > 0 else o
    return np.clip(noisy, low, high).astype(np.int64)


PREDICTORS = {"oracle": oracle, "uniform_noise": uniform_noise, "trace": from_trace, "gaussian_noise": gaussian_noise}


def predict(kind: str, requests: Requests, rng: np.random.Generator, **params) -> np.ndarray:
    if kind not in PREDICTORS:
        raise ConfigError(f"predictor.kind={kind!r}: allowed {', '.join(PREDICTORS)}")
    return PREDICTORS[kind](requests, rng, **params)
