"""CacheOPT's confidence-based padding (Shen et al., Sec. 3.2, eqs. 1-4; spec B2.2 and B8.1-B8.3).

Hoeffding's bound for one request's prediction error, P(X - X^ >= t) <= exp(-2 t^2 / (b - a)^2) (eq. 2), set equal
to 1 - c gives the padding (eq. 3):

    t = sqrt(-((b - a)^2 / 2) ln(1 - c)) = k(c) (b - a),    k(c) = sqrt(-ln(1 - c) / 2)

so k(0.9) = 1.073. The confidence is fixed (the paper's "confidence 90%", the headline setting) or adaptive,
c = alpha / (1 + beta lambda) (eq. 4) with lambda the measured arrival rate (spec B8.1: alpha = 8 as printed
cannot be a confidence, so alpha <= 1 is required here). The range (b - a) is undefined in the paper; spec B8.2's
choice is implemented: per 50-token bin of X^ and per direction, the p95 - p5 of the signed error on a calibration
split. The estimate is X^ + t when the classifier says "under", and X^ - t when it says "over" (as written). The
variant ``subtract_over=False`` keeps X^ (spec B8.3).
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from kvstudy.errors import ConfigError


def confidence_factor(c: float) -> float:
    """k(c) of eq. (3): the padding in units of the error range (b - a)."""
    if not 0 <= c < 1:
        raise ConfigError(f"confidence {c!r}: allowed 0 <= c < 1")
    return float(np.sqrt(-np.log1p(-c) / 2.0))


def padding(error_range: float, c: float) -> float:
    """t of eq. (3) for an error range (b - a)."""
    return confidence_factor(c) * float(error_range)


def adaptive_confidence(alpha: float, beta: float, arrival_rate: float) -> float:
    """c = alpha / (1 + beta lambda) (eq. 4), with 0 < alpha <= 1 and beta > 0 (spec B8.1)."""
    if not 0 < alpha <= 1:
        raise ConfigError(f"padding alpha={alpha!r}: allowed 0 < alpha <= 1 (a confidence; the paper's 8 cannot be one)")
    if not beta > 0:
        raise ConfigError(f"padding beta={beta!r}: allowed > 0")
    return float(alpha / (1.0 + beta * max(0.0, float(arrival_rate))))


def error_ranges(true: np.ndarray, predicted: np.ndarray, under: np.ndarray, width: int = 50) -> Dict[Tuple[int, int], float]:
    """(b - a) per (bin of X^, direction): p95 - p5 of the signed error X - X^ in that cell of a calibration split."""
    true, predicted, under = (np.asarray(x) for x in (true, predicted, under))
    err = true - predicted
    out = {}
    for key in set(zip((predicted // width).tolist(), under.tolist())):
        cell = (predicted // width == key[0]) & (under == key[1])
        out[key] = float(np.percentile(err[cell], 95) - np.percentile(err[cell], 5))
    return out


def padded_output(predicted: int, under: int, error_range: float, c: float, max_output: int,
                  subtract_over: bool = True) -> int:
    """s^o: X^ + t if the classifier says under, X^ - t if over (or X^ with ``subtract_over=False``), in [1, max]."""
    t = padding(error_range, c)
    estimate = predicted + t if under else (predicted - t if subtract_over else predicted)
    return int(min(max(1, round(estimate)), max_output))
