"""The request table every workload produces, and its validation."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from kvstudy.errors import DataError


@dataclass
class Requests:
    """Requests sorted by arrival time (ties keep input order); ``request_id`` is the input row, or for a trace
    the file's row (or its own id column), so results join back to the file."""

    request_id: np.ndarray
    arrival_time: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    predicted_output_tokens: Optional[np.ndarray] = None  # from a trace's own column, if any
    #: shared content (issue 36), per request a tuple of ``(key, length)`` pairs, or None: nobody shares anything.
    #: The request's token sequence starts with its segments' concatenation; equal keys mean equal content and
    #: length, so two requests agree on a prefix exactly when their segment lists do; tokens past the segments are the
    #: request's own. Segments may reach past the prompt into the output (a session's answer, which the next turn's
    #: prompt repeats). Prefix caching (memory.prefix_caching=true) keys its blocks by them
    #: (kvstudy/memory/prefix.py ``BlockKeys``); Mooncake's ``hash_ids`` become 512-token segments.
    segments: Optional[list] = None

    def __len__(self) -> int:
        return len(self.request_id)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"request_id": self.request_id, "arrival_time": self.arrival_time,
                             "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens})


#: the largest token count or id a table may hold: 2^31, so sums over a run stay far inside int64
MAX_COUNT = 2 ** 31
#: arrival times (seconds) must stay below 2^33 s (272 years): there float64's spacing is 2^-20 s (< 1 µs), above it
#: 2 µs and growing (at 1e17 s, 16 s: a 20 ms iteration added to such a time changes nothing, so latencies round to 0)
MAX_TIME_S = 2 ** 33
_BOOLS = (bool, np.bool_)


def refuse_booleans(values, source: str, label: str, allowed: str) -> None:
    """A DataError naming the first row holding a boolean (JSON true/false, a bool parquet or CSV column): pandas and
    numpy would read them as 1 and 0, so a count or time column refuses them (issue 46)."""
    series = values if isinstance(values, pd.Series) else pd.Series(values)
    if pd.api.types.is_bool_dtype(series.dtype):
        rows = np.arange(len(series))
    elif series.dtype == object:
        rows = np.flatnonzero([isinstance(v, _BOOLS) for v in series.tolist()])
    else:
        return
    if len(rows):
        row = int(rows[0])
        raise DataError(f"{source}: column {label} row {row} has value {bool(series.iloc[row])!r}, a boolean; "
                        f"allowed: {allowed} ({len(rows)} boolean row(s))")


def column_label(name: str, column: Optional[str] = None) -> str:
    """``'name'``, or ``'column' (name)`` when the file's column has another name than the field it feeds."""
    return f"'{name}'" if not column or column == name else f"'{column}' ({name})"


def regular_file(path, key: str = "workload.path") -> Path:
    """``path`` if it is a regular file (or a link to one). A FIFO would block the reader forever and a folder
    or device fails deep inside pandas, so each is refused in one line before anything opens it."""
    file = Path(path)
    if not file.exists():
        raise DataError(f"{key}={str(path)!r}: file not found")
    if not file.is_file():
        kind = "a folder" if file.is_dir() else "not a regular file (a pipe, socket or device)"
        raise DataError(f"{key}={str(path)!r}: {kind}; allowed: a regular file")
    return file


def _int_column(values, name: str, source: str, minimum: int, column: Optional[str] = None) -> np.ndarray:
    """``values`` as int64, each a whole number in [minimum, MAX_COUNT] (not a boolean); the first bad row is named.
    ``column``: the file's name for the column, when it is not ``name``."""
    label = column_label(name, column)
    refuse_booleans(values, source, label, f"whole numbers >= {minimum} and <= {MAX_COUNT:,}")
    arr = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(~np.isfinite(arr) | (arr < minimum) | (arr > MAX_COUNT) | (arr != np.round(arr)))
    if len(bad):
        row = int(bad[0])
        value = pd.Series(values).iloc[row]
        value = value.item() if hasattr(value, "item") else value
        raise DataError(f"{source}: column {label} row {row} has value {value!r}; "
                        f"allowed: whole numbers >= {minimum} and <= {MAX_COUNT:,} ({len(bad)} bad row(s))")
    return arr.astype(np.int64)


def check_segments(segments, source: str) -> list:
    """Each row's segments as a tuple of (int key, int length >= 1) pairs; a bad row is named."""
    out = []
    for row, entry in enumerate(segments):
        try:
            pairs = tuple((int(k), int(n)) for k, n in entry)
            ok = all(n >= 1 and n <= MAX_COUNT and float(k) == float(k0) and float(n) == float(n0)
                     and not isinstance(k0, _BOOLS) and not isinstance(n0, _BOOLS)  # true/false are not numbers
                     for (k, n), (k0, n0) in zip(pairs, entry))
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            raise DataError(f"{source}: column 'segments' row {row} has {str(entry)[:80]!r}; allowed: a list of "
                            f"(key, length) pairs of whole numbers, length 1..{MAX_COUNT:,}")
        out.append(pairs)
    return out


def make_requests(arrival_time, prompt_tokens, output_tokens, source: str, predicted=None,
                  sort: str = "warn", request_id=None, segments=None) -> Requests:
    """Validate and sort. Unsorted arrivals are re-sorted with a warning saying how many rows moved
    (``sort="warn"``) or rejected (``sort="error"``). ``request_id``: the ids to report (a trace's own id column,
    or its file rows); default the input position. Ids must be distinct whole numbers >= 0."""
    if len(pd.Series(prompt_tokens)) == 0:
        raise DataError(f"{source}: no requests (an empty table); allowed: at least one row")
    prompt = _int_column(prompt_tokens, "prompt_tokens", source, 1)
    output = _int_column(output_tokens, "output_tokens", source, 1)
    refuse_booleans(arrival_time, source, "'arrival_time'", "finite times >= 0 s")
    arrival = pd.to_numeric(pd.Series(arrival_time), errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(~np.isfinite(arrival) | (arrival < 0) | (arrival >= MAX_TIME_S))
    if len(bad):
        raise DataError(f"{source}: column 'arrival_time' row {int(bad[0])} has value {float(arrival[bad[0]])!r}; "
                        f"allowed: finite times >= 0 and < 2**33 = {MAX_TIME_S:,} s (float64 keeps them to the "
                        f"microsecond below it)")
    pred = None if predicted is None else _int_column(predicted, "predicted_output_tokens", source, 1)
    order = np.argsort(arrival, kind="stable")
    moved = int((order != np.arange(len(order))).sum())
    if moved:
        if sort == "error":
            raise DataError(f"{source}: arrival times are not sorted ({moved} rows out of order)")
        warnings.warn(f"{source}: arrival times were not sorted; re-sorted, {moved} rows moved", stacklevel=2)
    ids = np.arange(len(prompt)) if request_id is None else _int_column(request_id, "request_id", source, 0)
    if len(np.unique(ids)) != len(ids):
        values, counts = np.unique(ids, return_counts=True)
        raise DataError(f"{source}: column 'request_id' repeats id {int(values[counts > 1][0])} "
                        f"({int((counts > 1).sum())} id(s) repeated); allowed: distinct ids")
    ids = ids[order]
    if segments is not None:
        segments = check_segments(segments, source)
        segments = [segments[k] for k in order.tolist()]
    return Requests(ids, arrival[order], prompt[order], output[order], None if pred is None else pred[order],
                    segments)
