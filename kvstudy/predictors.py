"""Output-length predictors (config group ``predictor``): what policies see instead of the truth.

* ``oracle``: the true output length (Sec. 5.2 main experiments).
* ``uniform_noise``: o^ ~ U((1 - eps) o, (1 + eps) o), rounded, at least 1 (Sec. 5.2.2).
* ``trace``: the trace's own ``predicted_output_tokens`` column.
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


PREDICTORS = {"oracle": oracle, "uniform_noise": uniform_noise, "trace": from_trace}


def predict(kind: str, requests: Requests, rng: np.random.Generator, **params) -> np.ndarray:
    if kind not in PREDICTORS:
        raise ConfigError(f"predictor.kind={kind!r}: allowed {', '.join(PREDICTORS)}")
    return PREDICTORS[kind](requests, rng, **params)
