"""The MC-SF paper's LMSYS-Chat-1M workload (Sec. 5.2, Fig. 7).

The paper counts words: the prompt is the first user turn, each word of the first assistant reply is
an output token. Published statistics of its 10,000-conversation sample: prompt mean 40.62, median
11; output mean 85.32, median 45.

LMSYS-Chat-1M is gated and cannot be downloaded here, so the default draws lengths from log-normal
distributions matched to those four numbers (median = exp(mu), mean = exp(mu + sigma^2 / 2)):

    prompt: mu = ln 11 = 2.398,  sigma = sqrt(2 ln(40.62/11)) = 1.616
    output: mu = ln 45 = 3.807,  sigma = sqrt(2 ln(85.32/45)) = 1.131

rounded to whole tokens (at least 1) and redrawn (truncated, not clipped) while prompt + output
exceeds ``max_total_tokens`` (default: the model's context length), so no request is unservable by
construction. Truncation lowers the means slightly; the run's summary reports the measured ones.

With ``path`` set, the real dataset's parquet files (``conversation`` column of {role, content}
turns, as published) are read instead and ``num_requests`` conversations are sampled with the seed.
"""
from __future__ import annotations

import glob
from typing import Optional

import numpy as np
import pandas as pd

from kvstudy.errors import DataError
from kvstudy.workloads.requests import regular_file

PROMPT_MU, PROMPT_SIGMA = np.log(11.0), np.sqrt(2 * np.log(40.62 / 11.0))
OUTPUT_MU, OUTPUT_SIGMA = np.log(45.0), np.sqrt(2 * np.log(85.32 / 45.0))


def synthetic_lengths(num_requests: int, rng: np.random.Generator, max_total_tokens: int,
                      key: str = "workload.max_total_tokens") -> pd.DataFrame:
    """``key``: the config key the length limit came from (the model's context when max_total_tokens is null),
    so a limit too small is named under the key the user set."""
    prompt = np.empty(num_requests, dtype=np.int64)
    output = np.empty(num_requests, dtype=np.int64)
    if max_total_tokens < 2:
        raise DataError(f"{key}={max_total_tokens}: allowed >= 2 (one prompt and one output token)")
    todo = np.arange(num_requests)
    drawn = 0
    while len(todo):
        s = np.maximum(1, np.rint(rng.lognormal(PROMPT_MU, PROMPT_SIGMA, len(todo)))).astype(np.int64)
        o = np.maximum(1, np.rint(rng.lognormal(OUTPUT_MU, OUTPUT_SIGMA, len(todo)))).astype(np.int64)
        prompt[todo], output[todo] = s, o
        drawn += len(todo)
        todo = todo[s + o > max_total_tokens]
        if len(todo) and drawn > 1000 * num_requests:  # a bound so a tiny limit ends in a message, not a hang
            raise DataError(f"{key}={max_total_tokens}: fewer than 1 in 1,000 LMSYS-like requests "
                            f"fit in it; allowed a limit that leaves a workload (e.g. >= 64)")
    return pd.DataFrame({"prompt_tokens": prompt, "output_tokens": output})


def _words(text) -> int:
    return len(str(text).split())


def real_lengths(path: str, num_requests: int, rng: np.random.Generator) -> pd.DataFrame:
    files = sorted(glob.glob(path)) if any(ch in path for ch in "*?[") else [path]
    if not files:
        raise DataError(f"workload.path={path!r}: no files match")
    frames = []
    for f in files:
        regular_file(f)  # a FIFO or folder: one line, not a hang
        try:
            df = pd.read_parquet(f, columns=["conversation"])
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(f"{f}: cannot read an LMSYS-Chat-1M parquet file with a 'conversation' column ({exc})")
        frames.append(df)
    conversations = pd.concat(frames, ignore_index=True)["conversation"]
    prompt, output = [], []
    for turns in conversations:
        turns = list(turns)
        user = next((t["content"] for t in turns if t["role"] == "user"), None)
        reply = next((t["content"] for t in turns if t["role"] == "assistant"), None)
        if user is None or reply is None or _words(user) == 0 or _words(reply) == 0:
            continue
        prompt.append(_words(user))
        output.append(_words(reply))
    if len(prompt) < num_requests:
        raise DataError(f"workload.path={path!r}: {len(prompt)} usable conversations, "
                        f"fewer than workload.num_requests={num_requests}")
    pick = np.sort(rng.choice(len(prompt), size=num_requests, replace=False))
    return pd.DataFrame({"prompt_tokens": np.array(prompt)[pick], "output_tokens": np.array(output)[pick]})


def lmsys(num_requests: int, rng: np.random.Generator, max_model_len: int, path: Optional[str] = None,
          max_total_tokens: Optional[int] = None) -> pd.DataFrame:
    if num_requests < 1:
        raise DataError(f"workload.num_requests={num_requests}: must be >= 1")
    if path:
        return real_lengths(path, num_requests, rng)
    return synthetic_lengths(num_requests, rng, int(max_total_tokens or max_model_len),
                             "workload.max_total_tokens" if max_total_tokens else "model.max_model_len")
