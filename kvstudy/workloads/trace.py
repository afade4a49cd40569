"""Request traces from CSV, JSONL or parquet.

Columns (any may be renamed through ``columns``, e.g. ``workload.columns.prompt_tokens=ContextTokens``):
``prompt_tokens``, ``output_tokens``, optional ``arrival_time`` and ``predicted_output_tokens``.
Vidur's processed-trace names (``num_prefill_tokens``, ``num_decode_tokens``, ``arrived_at``) are
recognised without mapping. Timestamps: numbers in ``time_unit`` (s or ms), or ISO datetimes; they are
shifted so the first request arrives at 0.

Shared prefixes (issue 36): a ``hash_ids`` column (Mooncake's traces: per request the hashes of its prompt's
``hash_block_size``-token blocks, chained as a prefix, so equal leading ids are a reusable prefix) becomes the
requests' ``segments`` (kvstudy/memory/prefix.py ``mooncake_segments``: each id one block of ``hash_block_size``
tokens, the last one the prompt's remainder), which ``memory.prefix_caching=true`` keys its blocks by. A
``segments`` column (lists of [key, length] pairs) is read as it is.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pandas as pd

from kvstudy.errors import DataError
from kvstudy.memory.prefix import mooncake_segments
from kvstudy.workloads.requests import _int_column, regular_file

ALIASES = {
    "prompt_tokens": ["prompt_tokens", "num_prefill_tokens", "input_length"],   # input_length: Mooncake's traces
    "output_tokens": ["output_tokens", "num_decode_tokens", "output_length"],
    "arrival_time": ["arrival_time", "arrived_at", "timestamp"],                 # Mooncake's: ms (workload.time_unit=ms)
    "predicted_output_tokens": ["predicted_output_tokens"],
    "request_id": ["request_id"],
    "hash_ids": ["hash_ids"],
    "segments": ["segments"],
}
#: numeric timestamps read as seconds that span more than this are probably milliseconds (a warning says so)
SUSPECT_SPAN_S = 7 * 86400
OVER_CONTEXT = ("keep", "drop", "truncate")


def read_table(path: Path) -> pd.DataFrame:
    suffix = "".join(path.suffixes[-2:]) if path.suffix in (".gz", ".xz", ".bz2") else path.suffix
    try:
        if suffix.startswith(".csv"):
            return pd.read_csv(path)
        if suffix in (".jsonl", ".ndjson"):
            return pd.read_json(path, lines=True)
        if suffix == ".json":
            return pd.read_json(path)
        if suffix == ".parquet":
            return pd.read_parquet(path)
    except (ValueError, OSError) as exc:
        raise DataError(f"{path}: cannot read as {suffix} ({exc})")
    raise DataError(f"{path}: unknown trace format '{suffix}'; allowed: .csv, .jsonl, .json, .parquet")


def _to_seconds(values: pd.Series, unit: str, source: str) -> np.ndarray:
    if pd.api.types.is_numeric_dtype(values):
        scale = {"s": 1.0, "ms": 1e-3}.get(unit)
        if scale is None:
            raise DataError(f"workload.time_unit={unit!r}: allowed s, ms")
        seconds = values.to_numpy(dtype=float) * scale
        neg = np.flatnonzero(seconds < 0)
        if len(neg):
            raise DataError(f"{source}: arrival_time row {int(neg[0])} is negative ({values.iloc[int(neg[0])]!r}; "
                            f"{len(neg)} row(s)); allowed: times >= 0 (they are shifted so the first request is at 0)")
        span = float(np.nanmax(seconds) - np.nanmin(seconds)) if len(seconds) else 0.0
        if unit == "s" and span > SUSPECT_SPAN_S:
            warnings.warn(f"{source}: arrival_time spans {span / 86400:.1f} days read as seconds; if the file holds "
                          f"milliseconds set workload.time_unit=ms", stacklevel=3)
    else:
        parsed = pd.to_datetime(values, errors="coerce", utc=True, format="mixed")
        if parsed.isna().any():
            row = int(np.flatnonzero(parsed.isna().to_numpy())[0])
            raise DataError(f"{source}: arrival_time row {row} ({values.iloc[row]!r}) is neither a number nor an ISO datetime")
        seconds = (parsed - parsed.min()).dt.total_seconds().to_numpy()
    if np.isfinite(seconds).all() and len(seconds):
        seconds = seconds - np.nanmin(seconds)
    return seconds


SAMPLING = ("with_replacement", "without_replacement")


def _hash_segments(hash_ids: pd.Series, prompts: pd.Series, block: int, source) -> list:
    """Mooncake's ``hash_ids`` as segments; a row with more ids than its prompt has blocks is named (its ids would
    describe tokens the request does not have)."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise DataError(f"workload.hash_block_size={block!r}: a whole number of tokens >= 1 (Mooncake's: 512)")
    out = []
    for row, (ids, prompt) in enumerate(zip(hash_ids.tolist(), prompts.tolist())):
        if isinstance(ids, str):  # a CSV cell: "[3, 4, 5]"
            try:
                ids = json.loads(ids)
            except ValueError:
                pass
        if hasattr(ids, "tolist"):  # parquet: a numpy array per row
            ids = ids.tolist()
        if not isinstance(ids, (list, tuple)) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise DataError(f"{source}: column 'hash_ids' row {row} has {str(ids)[:80]!r}; allowed: a list of "
                            f"whole numbers (one per {block}-token block of the prompt)")
        if len(ids) > -(-int(prompt) // block):
            raise DataError(f"{source}: column 'hash_ids' row {row} has {len(ids)} ids for a prompt of {prompt} tokens "
                            f"(at most {-(-int(prompt) // block)} blocks of workload.hash_block_size={block})")
        out.append(mooncake_segments(ids, int(prompt), block))
    return out


def trace(path: str, columns: Optional[Dict[str, str]] = None, time_unit: str = "s",
          num_requests: Optional[int] = None, drop_over_context: bool = False,
          max_model_len: Optional[int] = None, sample: Optional[str] = None, rate_scale: float = 1.0,
          rng: Optional[np.random.Generator] = None, over_context: str = "keep",
          hash_block_size: int = 512) -> pd.DataFrame:
    """Read a trace.

    ``num_requests`` alone takes the first N rows. With ``sample`` (``with_replacement`` or
    ``without_replacement``) N rows are drawn at random with the run's length generator (``seed``, or
    ``workload.length_seed``), kept in the trace's row order so their timestamps stay ordered; drawn with
    replacement, a row can repeat (with its timestamp, unless ``+demand=`` gives new arrivals), so a trace can
    feed a volume sweep larger than itself. ``rate_scale`` divides the arrival times: 2 replays the trace at
    twice its rate.

    ``over_context``: what to do with a request whose prompt + output exceeds the model's context (a real server
    stops generating at the limit): ``keep`` simulates it as given (a warning counts them), ``drop`` removes it,
    ``truncate`` caps its output at context − prompt; each counts what it changed in a warning. A prompt alone
    longer than the context is an error under ``keep`` (the run names this key) and dropped under ``drop`` and
    ``truncate``. ``drop_over_context=True`` (the key before issue 35) drops only such prompts, whatever
    ``over_context`` does with the rest. The result keeps
    the file's row number as ``request_id`` (or the file's own ``request_id`` column), so runs join back to it;
    sampled with replacement, where a row can repeat, the ids are the positions in the draw."""
    if over_context not in OVER_CONTEXT:
        raise DataError(f"workload.over_context={over_context!r}: allowed {', '.join(OVER_CONTEXT)}")
    if sample is not None and sample not in SAMPLING:
        raise DataError(f"workload.sample={sample!r}: allowed {', '.join(SAMPLING)} or null (the first rows)")
    if isinstance(rate_scale, bool) or not isinstance(rate_scale, (int, float)) or not rate_scale > 0:
        raise DataError(f"workload.rate_scale={rate_scale!r}: must be a number > 0 (2 = twice the trace's rate)")
    if not path:
        raise DataError("workload.path is required for workload=trace (a .csv, .jsonl or .parquet file)")
    file = regular_file(path)  # a FIFO or folder: one line, never a hang
    raw = read_table(file)
    columns = dict(columns or {})
    out = {}
    for field, names in ALIASES.items():
        candidates = [columns[field]] if field in columns and columns[field] else names
        found = next((c for c in candidates if c in raw.columns), None)
        if found is None:
            if field in ("prompt_tokens", "output_tokens"):
                raise DataError(f"{path}: missing column for '{field}' (looked for {candidates}); "
                                f"columns present: {list(raw.columns)}; map one with workload.columns.{field}=NAME")
            continue
        out[field] = raw[found]
    df = pd.DataFrame(out)
    if not len(df):
        raise DataError(f"{path}: no requests (the file has a header but no rows); allowed: at least one row")
    for field in ("prompt_tokens", "output_tokens"):  # here, before drops and sampling, a row is the file's row
        _int_column(df[field], field, path, 1)
    if "hash_ids" in df:
        df["segments"] = _hash_segments(df.pop("hash_ids"), df["prompt_tokens"], hash_block_size, path)
    if "request_id" not in df:
        df["request_id"] = np.arange(len(df))  # the file's row, kept through drops and sampling
    if "arrival_time" in df:
        df["arrival_time"] = _to_seconds(df["arrival_time"], time_unit, path)
    if (drop_over_context or over_context != "keep") and max_model_len:
        # a prompt alone longer than the context: no server can serve it, so drop and truncate both drop it
        over = pd.to_numeric(df["prompt_tokens"], errors="coerce") > max_model_len
        if over.any():
            warnings.warn(f"{path}: dropped {int(over.sum())} of {len(df)} requests with prompts longer than the "
                          f"model context {max_model_len} (workload."
                          f"{'drop_over_context=true' if drop_over_context else f'over_context={over_context}'})",
                          stacklevel=2)
            df = df[~over].reset_index(drop=True)
    if max_model_len:
        prompt = pd.to_numeric(df["prompt_tokens"], errors="coerce")
        total = prompt + pd.to_numeric(df["output_tokens"], errors="coerce")
        long = (total > max_model_len) & (prompt <= max_model_len)
        if long.any():
            count = f"{int(long.sum())} of {len(df)} requests whose prompt + output exceeds the model context {max_model_len}"
            if over_context == "drop":
                warnings.warn(f"{path}: dropped {count} (workload.over_context=drop)", stacklevel=2)
                df = df[~long].reset_index(drop=True)
            elif over_context == "truncate":
                warnings.warn(f"{path}: output capped at context - prompt for {count} (workload.over_context="
                              f"truncate)", stacklevel=2)
                df.loc[long, "output_tokens"] = (max_model_len - prompt[long]).astype(np.int64)
            else:
                warnings.warn(f"{path}: {count}: simulated as given (workload.over_context=keep; drop or "
                              f"truncate them instead)", stacklevel=2)
    if sample is not None:
        if not num_requests:
            raise DataError(f"workload.sample={sample}: set workload.num_requests, the number of requests to draw")
        if sample == "without_replacement" and num_requests > len(df):
            raise DataError(f"workload.num_requests={num_requests} but {path} has only {len(df)} rows to draw "
                            f"without replacement; use workload.sample=with_replacement")
        rng = rng if rng is not None else np.random.default_rng(0)
        rows = np.sort(rng.choice(len(df), size=num_requests, replace=sample == "with_replacement"))
        df = df.iloc[rows].copy()
        if sample == "with_replacement":  # a row can repeat, so ids are the draw's positions, not file rows
            df["request_id"] = np.arange(len(df))
    elif num_requests:
        if num_requests > len(df):
            raise DataError(f"workload.num_requests={num_requests} but {path} has only {len(df)} rows")
        df = df.iloc[:num_requests]
    df = df.reset_index(drop=True)
    if rate_scale != 1 and "arrival_time" in df:
        df["arrival_time"] = (df["arrival_time"] - df["arrival_time"].min()) / float(rate_scale)
    return df
