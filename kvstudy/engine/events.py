"""What happened inside a run (``record.events=true``): every request's events and every iteration's batch.

The engine (kvstudy/engine/loop.py) calls an :class:`EventLog` at each event when one is given, and nothing
otherwise (its calls sit behind ``if events is not None``, so a run without it does no extra work). Two tables land
in the run folder beside the others:

``events.parquet``: one row per event, in the order they happened: ``time`` (seconds, the engine's clock),
``iteration`` (the row of iterations.parquet the event belongs to; -1 for a rejection before the run starts; a
step that computes nothing, only preempts or swaps, has no row of its own: its events carry the next row's index,
or the number of rows if the run ends first),
``request_id`` (requests.parquet's; -1 for a clearing event, which concerns the whole batch), ``kind``, ``mode``,
``tokens``:

* ``admit``: the request starts a prefill (its first or, after a recompute, again); ``tokens``: the prefill's
  length (prompt + tokens generated before, in the memory model's convention);
* ``first_token``: its first output token (stamped as requests.parquet's ``first_token_time``);
* ``preempt``: a policy preempted it; ``mode`` ``recompute``, ``swap``, or ``recompute_fallback`` (a swap that found
  no host space and recomputed instead: requests.parquet's ``swap_fallbacks``); ``tokens``: its KV tokens dropped
  (recompute) or moved (swap);
* ``evict``: dropped in a clearing event (an admission-only policy over-committed memory; MC-SF paper Sec. 4's
  clearing), ``mode`` ``recompute``; the ``clear`` event of the same iteration gives ``tokens`` = victims;
* ``swap_in``: its blocks came back from host memory;
* ``finish``: its last token; ``reject``: it can never be served (requests.parquet's ``reject_reason`` says why);
* ``handed_in`` (prefill/decode disaggregation, kvstudy/cluster/disaggregated.py): the request joins a decode
  replica's queue with its first token made on a prefill replica; ``tokens``: its prompt, whose KV it pulls when
  admitted (the prefill replica's ``finish`` of it is its prefill's end, dropped from the cluster's table).

So ``preempt`` + ``evict`` events of a request equal its ``preemptions``; ``finish`` events equal the completed
requests; the first ``first_token`` equals ``first_token_time``.

``batches.parquet``: one row per request per iteration it computed in: ``iteration``, ``request_id``, ``phase``
(``prefill`` or ``decode``) and ``tokens`` (the prefill chunk, or 1 for a decode). Its rows of an iteration add up to
iterations.parquet's ``batch_size``, ``prefill_tokens`` and ``decode_tokens``. A run of 10^4 requests with
hundreds of tokens each writes millions of rows: it is for looking inside a run, not for sweeps.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

KINDS = ("admit", "first_token", "preempt", "evict", "clear", "swap_in", "finish", "reject", "handed_in")
_KIND = {k: n for n, k in enumerate(KINDS)}
MODES = ("", "recompute", "swap", "recompute_fallback")
_MODE = {m: n for n, m in enumerate(MODES)}
PHASES = ("prefill", "decode")


class EventLog:
    """Events and batch membership as the engine reports them (request indices; ids when the tables are built)."""

    def __init__(self) -> None:
        self.step = -1  # the iteration under way (the engine sets it before each one)
        self._t, self._it, self._req, self._kind, self._mode, self._tok = [], [], [], [], [], []
        self._b_it, self._b_req, self._b_phase, self._b_tok = [], [], [], []

    def add(self, t: float, i: int, kind: str, mode: str = "", tokens: int = 0, step=None) -> None:
        self._t.append(t)
        self._it.append(self.step if step is None else step)
        self._req.append(i)
        self._kind.append(_KIND[kind])
        self._mode.append(_MODE[mode])
        self._tok.append(tokens)

    def decoded(self, requests) -> None:
        """Every request in ``requests`` decoded one token in this iteration."""
        n = len(requests)
        self._b_it.extend([self.step] * n)
        self._b_req.extend(requests)
        self._b_phase.extend([1] * n)
        self._b_tok.extend([1] * n)

    def prefilled(self, chunks) -> None:
        """``chunks``: (request, tokens) pairs prefilled in this iteration."""
        for i, tokens in chunks:
            self._b_it.append(self.step)
            self._b_req.append(i)
            self._b_phase.append(0)
            self._b_tok.append(tokens)

    def tables(self, request_id: np.ndarray):
        """(events, batches) as DataFrames, request indices turned into requests.parquet's ``request_id``."""
        ids = np.asarray(request_id, dtype=np.int64)
        req = np.asarray(self._req, dtype=np.int64)
        events = pd.DataFrame({
            "time": np.asarray(self._t, dtype=float), "iteration": np.asarray(self._it, dtype=np.int64),
            "request_id": np.where(req >= 0, ids[np.maximum(req, 0)] if len(ids) else req, -1),
            "kind": pd.Categorical.from_codes(np.asarray(self._kind, dtype=np.int64), KINDS),
            "mode": pd.Categorical.from_codes(np.asarray(self._mode, dtype=np.int64), MODES),
            "tokens": np.asarray(self._tok, dtype=np.int64)})
        b_req = np.asarray(self._b_req, dtype=np.int64)
        batches = pd.DataFrame({
            "iteration": np.asarray(self._b_it, dtype=np.int64),
            "request_id": ids[b_req] if len(b_req) else b_req,
            "phase": pd.Categorical.from_codes(np.asarray(self._b_phase, dtype=np.int64), PHASES),
            "tokens": np.asarray(self._b_tok, dtype=np.int64)})
        return events, batches
