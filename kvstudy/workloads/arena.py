"""The RR-SJF paper's workload (Gogineni et al., Sec. 3; spec A4): 1,000 Chatbot Arena first-turn prompts
answered by Llama-3.2-1B, half of them cut at the 1,024-token cap.

Selection (the authors' client, ``custom_benchmarks``' ``_get_data``): walk the 20,000 rows in their original
order; take the first 500 with output < 1,024 and the first 500 with output >= 1,024 that pass prompt >= 4,
output >= 4, prompt <= 1,024 and prompt + output <= 2,048 tokens (if one group is short, the other fills
in); then ``random.seed(0); random.shuffle(...)`` (Python's generator, as the client does).

Lengths: ``output_tokens`` is the tokenizer's count of the generated text, which includes a BOS token (a
response cut at the cap reads 1,025); kvstudy simulates ``output_tokens - 1`` generated tokens, so half the
requests generate exactly 1,024. The prompt's token count was not recorded; kvstudy takes
``max(1, round(prompt_chars / chars_per_token))`` with 4 characters per token (the usual English ratio for
Llama tokenizers), and the filters use that count too.

Data and licence: the 1,000 selected rows ship with kvstudy (``kvstudy/workloads/data/arena_rr_sjf.csv``,
lengths only) so the workload runs without ../shared. They are derived from the RR-SJF authors' fork
(``sastec17/585_vllm``, ``custom_benchmarks/data``, Apache-2.0) through the lengths table
``arena_llama32_1b_lengths.csv``; ``python -m kvstudy.workloads.arena build --source FILE`` rebuilds the
shipped file from that table, and a test checks it does so byte for byte. ``workload.path`` may point to
such a lengths table (columns source, index, prompt_chars, output_tokens) to select from it instead.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Optional

import pandas as pd

from kvstudy.config.validate import check_group
from kvstudy.errors import ConfigError, DataError, cli_entry
from kvstudy.workloads.requests import regular_file

SHIPPED = Path(__file__).with_name("data") / "arena_rr_sjf.csv"
COLUMNS = ("source", "index", "prompt_chars", "output_tokens")
CAP = 1024


def prompt_tokens(chars, chars_per_token: float):
    return (chars / chars_per_token).round().clip(lower=1).astype("int64")


def select(table: pd.DataFrame, chars_per_token: float = 4.0, per_group: int = 500, seed: int = 0) -> pd.DataFrame:
    """The authors' rule on a lengths table in its original row order (see the module docstring)."""
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise DataError(f"arena lengths table lacks column(s) {missing}; needs {', '.join(COLUMNS)}")
    s = prompt_tokens(table["prompt_chars"], chars_per_token)
    o = table["output_tokens"].astype("int64")
    ok = (s >= 4) & (o >= 4) & (s <= 1024) & (s + o <= 2048)
    short = table.index[ok & (o < CAP)].tolist()
    long = table.index[ok & (o >= CAP)].tolist()
    take_short = short[:per_group]
    take_long = long[:per_group]
    if len(take_short) < per_group:  # one group short: the other fills in
        take_long = long[:2 * per_group - len(take_short)]
    elif len(take_long) < per_group:
        take_short = short[:2 * per_group - len(take_long)]
    rows = take_short + take_long
    random.Random(seed).shuffle(rows)
    return table.loc[rows, list(COLUMNS)].reset_index(drop=True)


def arena(num_requests: int = 1000, path: Optional[str] = None, chars_per_token: float = 4.0,
          max_model_len: Optional[int] = None) -> pd.DataFrame:
    """The first ``num_requests`` of the shuffled selection: prompt and output tokens (no arrival times;
    choose ``+demand=offline`` for the paper's burst at t = 0, or a Poisson rate)."""
    check_group("workload", {"_target_": "kvstudy.workloads.arena.arena", "num_requests": num_requests,
                             "chars_per_token": chars_per_token})  # their bounds: kvstudy/config/schema.py
    if path is None:
        chosen = pd.read_csv(SHIPPED)
        missing = [c for c in COLUMNS if c not in chosen.columns]
        if missing:
            raise DataError(f"{SHIPPED}: lacks column(s) {missing}; needs {', '.join(COLUMNS)}")
    else:
        chosen = select(pd.read_csv(regular_file(path)), chars_per_token)  # a FIFO: one line, not a hang
    if num_requests > len(chosen):
        raise ConfigError(f"workload.num_requests={num_requests}: the arena selection has {len(chosen)} requests")
    chosen = chosen.iloc[:num_requests]
    out = pd.DataFrame({"prompt_tokens": prompt_tokens(chosen["prompt_chars"], chars_per_token),
                        "output_tokens": chosen["output_tokens"].astype("int64") - 1})  # less the BOS token
    if max_model_len is not None and (out.prompt_tokens + out.output_tokens > max_model_len).any():
        worst = int((out.prompt_tokens + out.output_tokens).max())
        raise ConfigError(f"workload arena: a request needs {worst} tokens of context, more than the model's "
                          f"max_model_len={max_model_len}")
    return out


@cli_entry
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "build":
        print("usage: python -m kvstudy.workloads.arena build [--source FILE]", file=sys.stderr)
        return 2
    from kvstudy.running.paths import SHARED_REFERENCE

    source = Path(argv[argv.index("--source") + 1]) if "--source" in argv else \
        SHARED_REFERENCE / "traces-extra" / "arena_llama32_1b_lengths.csv"
    if not source.exists():
        raise ConfigError(f"--source {source}: no such file")
    chosen = select(pd.read_csv(source))
    SHIPPED.parent.mkdir(parents=True, exist_ok=True)
    chosen.to_csv(SHIPPED, index=False)
    print(f"wrote {SHIPPED}: {len(chosen)} requests, output_tokens >= {CAP}: {(chosen.output_tokens >= CAP).sum()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
