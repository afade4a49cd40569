"""Request traces from CSV, JSONL or parquet.

Columns (any may be renamed through ``columns``, e.g. ``workload.columns.prompt_tokens=ContextTokens``):
``prompt_tokens``, ``output_tokens``, optional ``arrival_time`` and ``predicted_output_tokens``.
Vidur's processed-trace names (``num_prefill_tokens``, ``num_decode_tokens``, ``arrived_at``) are
recognised without mapping. Timestamps: numbers in ``time_unit`` (s or ms), or ISO datetimes; they are
shifted so the first request arrives at 0.

Shared prefixes (issue 36): a ``hash_ids`` column (Mooncake's traces: per request the hashes of its prompt's
``hash_block_size``-token blocks, chained as a prefix, so equal leading ids are a reusable prefix) becomes the
requests' ``segments`` (``mooncake_segments`` below: each id one block of ``hash_block_size``
tokens, the last one the prompt's remainder), which ``memory.prefix_caching=true`` keys its blocks by. A
``segments`` column (lists of [key, length] pairs; in a CSV cell as JSON) is read as it is. A file holds one of the
two, not both.

Checks (issue 46), each one line naming the file, the column, the row and what is allowed: every value of a numeric
column is a number, never a boolean (JSON true/false, a bool column); arrival times stay below 2**33 s after
``time_unit`` (float64 keeps them to the microsecond there); a file names each column once (a CSV header's repeated
name, a JSON record's repeated key); each column feeds one field (two ``workload.columns`` settings, or a setting
and another field's own name, reading one column are refused, as is a setting naming no column of the file); and the
hash ids' counts must match ``hash_block_size`` (``_hash_segments``).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np
import pandas as pd

from kvstudy.errors import ConfigError, DataError
from kvstudy.workloads.requests import (MAX_TIME_S, _int_column, check_segments, column_label, refuse_booleans,
                                       regular_file)

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
    """The file as a table; a column name given twice is refused (pandas would rename a CSV's second ``x`` to
    ``x.1`` and keep the last of a JSON record's repeated keys, each silently). JSON values keep their types
    (``dtype=False``): pandas would otherwise turn a column mixing numbers and true/false into numbers (true: 1) and
    guess a unit for a date-named column's large numbers, turning them into datetimes (``time_unit`` says what they
    are)."""
    suffix = "".join(path.suffixes[-2:]) if path.suffix in (".gz", ".xz", ".bz2") else path.suffix
    try:
        if suffix.startswith(".csv"):
            raw = pd.read_csv(path)
            header = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False).iloc[0].tolist()
            _unique_names(path, [name for name in header if name != ""], "the header")
        elif suffix in (".jsonl", ".ndjson", ".json"):
            lines = suffix != ".json"
            raw = pd.read_json(path, lines=lines, dtype=False)
            _unique_json_keys(path, lines=lines)
        elif suffix == ".parquet":
            raw = pd.read_parquet(path)
        else:
            raise DataError(f"{path}: unknown trace format '{suffix}'; allowed: .csv, .jsonl, .json, .parquet")
    except (ValueError, OSError) as exc:
        raise DataError(f"{path}: cannot read as {suffix} ({exc})")
    _unique_names(path, [str(name) for name in raw.columns], "its columns")
    return raw


def _unique_names(path: Path, names: list, where: str) -> None:
    seen = pd.Series(names, dtype=object)
    twice = seen[seen.duplicated(keep=False)]
    if len(twice):
        name = twice.iloc[0]
        positions = [i for i, n in enumerate(names) if n == name]
        raise DataError(f"{path}: column {name!r} appears {len(positions)} times in {where} (positions {positions}); "
                        f"allowed: each column name once (rename or remove the repeats)")


class _RepeatedKey(Exception):
    pass


def _unique_json_keys(path: Path, lines: bool) -> None:
    """One pass of Python's ``json`` over the file: a key repeated in one object (``json`` and pandas keep the last
    value silently) is refused."""

    def pairs_hook(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise _RepeatedKey(next(k for i, k in enumerate(keys) if k in keys[:i]))
        return dict(pairs)

    def check(text: str, where: str) -> None:
        try:
            json.loads(text, object_pairs_hook=pairs_hook)
        except _RepeatedKey as exc:
            raise DataError(f"{path}: {where} has key {exc.args[0]!r} twice in one record (a JSON reader keeps the "
                            f"last silently); allowed: each column name once per record")
        except ValueError:  # what pandas read and json does not: nothing more to check here
            pass

    with open(path, encoding="utf-8", errors="replace") as fh:
        if lines:
            for number, line in enumerate(fh, 1):
                if line.strip():
                    check(line, f"line {number}")
        else:
            check(fh.read(), "the file")


def _to_seconds(values: pd.Series, unit: str, source: str, column: Optional[str] = None) -> np.ndarray:
    label = column_label("arrival_time", column)
    refuse_booleans(values, source, label, f"numbers of workload.time_unit={unit} >= 0, or ISO datetimes")
    if pd.api.types.is_numeric_dtype(values):
        scale = {"s": 1.0, "ms": 1e-3}.get(unit)
        if scale is None:
            raise DataError(f"workload.time_unit={unit!r}: allowed s, ms")
        seconds = values.to_numpy(dtype=float) * scale
        neg = np.flatnonzero(seconds < 0)
        if len(neg):
            where = "arrival_time" if label == "'arrival_time'" else f"column {label}"
            raise DataError(f"{source}: {where} row {int(neg[0])} is negative ({values.iloc[int(neg[0])]!r}; "
                            f"{len(neg)} row(s)); allowed: times >= 0 (they are shifted so the first request is at 0)")
        with np.errstate(invalid="ignore"):
            huge = np.flatnonzero(np.isfinite(seconds) & (seconds >= MAX_TIME_S))  # nan and inf: make_requests
        if len(huge):
            row = int(huge[0])
            value = values.iloc[row]
            value = value.item() if hasattr(value, "item") else value
            hint = ("if the file holds milliseconds set workload.time_unit=ms" if unit == "s" and
                    seconds[row] * 1e-3 < MAX_TIME_S else "subtract a start time from the column first")
            raise DataError(f"{source}: column {label} row {row} has value {value!r} ({seconds[row]:.4g} s with "
                            f"workload.time_unit={unit}; {len(huge)} row(s)); allowed: times < 2**33 = "
                            f"{MAX_TIME_S:,} s, below which float64 keeps them to the microsecond (at "
                            f"{seconds[row]:.2g} s its step is {np.spacing(seconds[row]):.2g} s: shorter latencies "
                            f"are lost); {hint}")
        span = float(np.nanmax(seconds) - np.nanmin(seconds)) if len(seconds) else 0.0
        if unit == "s" and span > SUSPECT_SPAN_S:
            warnings.warn(f"{source}: arrival_time spans {span / 86400:.1f} days read as seconds; if the file holds "
                          f"milliseconds set workload.time_unit=ms", stacklevel=3)
    else:
        parsed = pd.to_datetime(values, errors="coerce", utc=True, format="mixed")
        if parsed.isna().any():
            row = int(np.flatnonzero(parsed.isna().to_numpy())[0])
            where = "arrival_time" if label == "'arrival_time'" else f"column {label}"
            raise DataError(f"{source}: {where} row {row} ({values.iloc[row]!r}) is neither a number nor an ISO datetime")
        seconds = (parsed - parsed.min()).dt.total_seconds().to_numpy()
        huge = np.flatnonzero(seconds >= MAX_TIME_S)
        if len(huge):
            row = int(huge[0])
            raise DataError(f"{source}: column {label} row {row} ({values.iloc[row]!r}) is {seconds[row]:.4g} s after "
                            f"the first datetime; allowed: spans < 2**33 = {MAX_TIME_S:,} s (272 years), below which "
                            f"float64 keeps times to the microsecond")
    if np.isfinite(seconds).all() and len(seconds):
        seconds = seconds - np.nanmin(seconds)
    return seconds


SAMPLING = ("with_replacement", "without_replacement")


def _json_cell(cell):
    """A CSV cell holding JSON (``"[3, 4, 5]"``) as its value, a parquet cell's numpy array as a list."""
    if isinstance(cell, str):
        try:
            cell = json.loads(cell)
        except ValueError:
            pass
    if hasattr(cell, "tolist"):
        cell = cell.tolist()
    return cell


def _is_id(h) -> bool:
    return isinstance(h, (int, np.integer)) and not isinstance(h, (bool, np.bool_)) and -2 ** 63 <= h < 2 ** 63


def _block_sizes(count: np.ndarray, prompt: np.ndarray):
    """The range (lo, hi) of block sizes b for which every row's id count is ceil(prompt / b) (Mooncake's way), or
    else floor(prompt / b) (ids for full blocks only); None if no one b fits (or nothing bounds it)."""
    if not len(count):
        return None
    many = count >= 2
    if many.any():
        lo, hi = int((-(-prompt // count)).max()), int(((prompt[many] - 1) // (count[many] - 1)).min())
        if lo <= hi:
            return lo, hi
    lo, hi = int((prompt // (count + 1) + 1).max()), int((prompt // count).min())
    return (lo, hi) if lo <= hi else None


def _sizes_text(fit) -> str:
    lo, hi = fit
    return (f"{lo}" if lo == hi else f"{lo}..{hi}") + (" (Mooncake's 512)" if lo <= 512 <= hi else "")


def _hash_segments(hash_ids: pd.Series, prompts: pd.Series, block: int, source, column: Optional[str] = None) -> list:
    """Mooncake's ``hash_ids`` as segments. Each row's ids are whole numbers (not true/false) within int64, and their
    count must agree with ``block``: a row with more ids than ceil(prompt / block) is named (its ids would describe
    tokens the request does not have), and so is a trace where most rows with ids have fewer than their prompts' full
    blocks while every count fits one other block size (the trace's own: ``workload.hash_block_size`` is not the
    trace's). Fewer ids in a few rows, or counts no one block size explains, are read as they are: ids for a shared
    prefix only, the rest of the prompt the request's own (as a last partial block without an id is)."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise DataError(f"workload.hash_block_size={block!r}: a whole number of tokens >= 1 (Mooncake's: 512)")
    label = column_label("hash_ids", column)
    rows = []
    for row, ids in enumerate(hash_ids.tolist()):
        ids = _json_cell(ids)
        if not isinstance(ids, (list, tuple)) or not all(_is_id(h) for h in ids):
            booleans = isinstance(ids, (list, tuple)) and any(isinstance(h, (bool, np.bool_)) for h in ids)
            raise DataError(f"{source}: column {label} row {row} has {str(ids)[:80]!r}{' (booleans)' if booleans else ''}; "
                            f"allowed: a list of whole numbers within int64, not true/false (one per {block}-token "
                            f"block of the prompt)")
        rows.append(ids)
    prompt = pd.to_numeric(prompts).to_numpy(dtype=float).astype(np.int64)  # whole numbers >= 1, checked before
    count = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    has = count >= 1
    fit = _block_sizes(count[has], prompt[has])
    need = -(-prompt // block)
    more = np.flatnonzero(count > need)
    if len(more):
        r = int(more[0])
        fits = f"; the counts fit workload.hash_block_size={_sizes_text(fit)}" if fit else ""
        raise DataError(f"{source}: column {label} row {r} has {count[r]} ids for a prompt of {prompt[r]} tokens "
                        f"(at most {need[r]} blocks of workload.hash_block_size={block}); {len(more)} of {len(count)} "
                        f"rows have more ids than ceil(prompt / {block}){fits}")
    short = np.flatnonzero(has & (count < prompt // block))
    if len(short) >= 2 and 2 * len(short) > int(has.sum()) and fit and len(np.unique(count[has])) >= 2:
        r = int(short[0])
        raise DataError(f"{source}: column {label}: {len(short)} of {int(has.sum())} rows with ids have fewer than "
                        f"their prompts' full blocks of workload.hash_block_size={block} (row {r}: {count[r]} ids for "
                        f"a prompt of {prompt[r]} tokens, {prompt[r] // block} full blocks), and every row's count "
                        f"fits workload.hash_block_size={_sizes_text(fit)}; allowed: the trace's block size")
    # counts one block size explains (or a range of them, of which the trace's is the power of two): another size
    # reads every shared block with the wrong number of tokens, said once
    pows = [1 << k for k in range(31) if fit and fit[0] <= 1 << k <= fit[1]]
    best = pows[0] if pows else (fit[0] if fit and fit[0] == fit[1] else None)
    if best is not None and block != best:
        which = f", of which {best} is a power of two" if fit[0] != fit[1] else ""
        warnings.warn(f"{source}: workload.hash_block_size={block} is not the trace's block size: every row's id count "
                      f"fits block size {_sizes_text(fit)}{which}; read as {block}-token blocks, each shared block is off by {abs(best - block)} tokens: give "
                      f"workload.hash_block_size={best}", stacklevel=2)
    return [mooncake_segments(ids, int(p), block) for ids, p in zip(rows, prompt.tolist())]


def _column_settings(columns, path) -> dict:
    """``workload.columns`` as a dict; a field the reader does not have, or two fields set to one column, is refused."""
    columns = dict(columns or {})
    unknown = [field for field in columns if field not in ALIASES]
    if unknown:
        raise ConfigError(f"workload.columns.{unknown[0]}: not a field a trace has; allowed: {', '.join(ALIASES)}")
    named = {}
    for field, column in columns.items():
        if not column:
            continue
        if column in named:
            raise ConfigError(f"workload.columns.{named[column]}={column!r} and workload.columns.{field}={column!r} "
                              f"both read column {column!r} of {path}; allowed: each column read by one field")
        named[column] = field
    return columns


def _collision(path, column, first: str, second: str, columns: dict) -> str:
    """The message for a column two fields would read: one through its setting, the other under its own name."""
    mapped, own = (first, second) if columns.get(first) else (second, first)
    return (f"{path}: column {column!r} would be read as both {mapped} (workload.columns.{mapped}={column!r}) and "
            f"{own} (whose own name it is); allowed: each column read by one field: set workload.columns.{mapped} "
            f"to another column, or workload.columns.{own} to the column {own} is in")


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
    columns = _column_settings(columns, path)
    out, used = {}, {}  # field -> the file's column; the file's column -> field
    claimed = {column: field for field, column in columns.items() if column}  # by a workload.columns setting
    for field, names in ALIASES.items():
        candidates = [columns[field]] if columns.get(field) else names
        present = [c for c in candidates if c in raw.columns]
        found = present[0] if present else None
        taken = [c for c in present if claimed.get(c, field) != field]
        if taken:  # another field's setting reads a column that is this field's own name
            raise ConfigError(_collision(path, taken[0], claimed[taken[0]], field, columns))
        if len(present) > 1:  # two of the field's names: the first would be read and the other dropped silently
            raise DataError(f"{path}: columns {present[0]!r} and {present[1]!r} are both names of {field}; allowed: "
                            f"one of them, chosen with workload.columns.{field}=NAME (or the other removed)")
        if found is None:
            if field in ("prompt_tokens", "output_tokens"):
                raise DataError(f"{path}: missing column for '{field}' (looked for {candidates}); "
                                f"columns present: {list(raw.columns)}; map one with workload.columns.{field}=NAME")
            if columns.get(field):  # a setting naming nothing would leave the field out silently
                raise DataError(f"{path}: workload.columns.{field}={columns[field]!r} names no column of the file; "
                                f"columns present: {list(raw.columns)}; allowed: one of them, or null ({names})")
            continue
        if found in used:
            raise ConfigError(_collision(path, found, used[found], field, columns))
        used[found] = field
        out[field] = raw[found]
    name = {field: column for column, field in used.items()}
    if "hash_ids" in out and "segments" in out:
        raise DataError(f"{path}: columns {name['hash_ids']!r} (hash ids, one per workload.hash_block_size="
                        f"{hash_block_size} tokens) and {name['segments']!r} ([key, length] pairs) both describe "
                        f"shared prefixes and one would replace the other; allowed: one of them: keep 'hash_ids' "
                        f"(Mooncake's block hashes) or 'segments' and remove the other column")
    df = pd.DataFrame(out)
    if not len(df):
        raise DataError(f"{path}: no requests (the file has a header but no rows); allowed: at least one row")
    for field, least in (("prompt_tokens", 1), ("output_tokens", 1), ("predicted_output_tokens", 1), ("request_id", 0)):
        if field in df:  # here, before drops and sampling, a row is the file's row
            _int_column(df[field], field, path, least, column=name[field])
    if "hash_ids" in df:
        df["segments"] = _hash_segments(df.pop("hash_ids"), df["prompt_tokens"], hash_block_size, path,
                                        column=name["hash_ids"])
    elif "segments" in df:  # checked here, where a row is the file's (make_requests reads them again)
        cells = [_json_cell(cell) for cell in df["segments"].tolist()]
        check_segments(cells, path)
        df["segments"] = cells
    if "request_id" not in df:
        df["request_id"] = np.arange(len(df))  # the file's row, kept through drops and sampling
    if "arrival_time" in df:
        df["arrival_time"] = _to_seconds(df["arrival_time"], time_unit, path, column=name["arrival_time"])
    if (drop_over_context or over_context != "keep") and max_model_len:
        # a prompt alone longer than the context: no server can serve it, so drop and truncate both drop it
        over = pd.to_numeric(df["prompt_tokens"], errors="coerce") > max_model_len
        if over.any():
            warnings.warn(f"{path}: dropped {int(over.sum())} of {len(df)} requests with prompts longer than the "
                          f"model context {max_model_len} (workload."
                          f"{'drop_over_context=true, the older spelling of workload.over_context=drop' if drop_over_context else f'over_context={over_context}'})",
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


def mooncake_segments(hash_ids: Sequence[int], prompt_tokens: int, trace_block: int = 512) -> list:
    """Mooncake's ``hash_ids`` (one per ``trace_block``-token block of the prompt, chained as a prefix) as segments:
    each id a segment of ``trace_block`` tokens, the last one the prompt's remainder (a partial block is its own
    content: never shared with a longer block of the same id)."""
    return [(int(h), min(trace_block, int(prompt_tokens) - t * trace_block)) for t, h in enumerate(hash_ids)
            if t * trace_block < prompt_tokens]
