"""Pipeline parallelism as Vidur's simulator runs it (issue 58): a replica of ``stages`` pipeline stages keeps up to
``stages`` batches in flight, each stage busy with a different batch.

Vidur (``vidur/scheduler/replica_scheduler/base_replica_scheduler.py``, ``replica_stage_scheduler``, the
``batch_stage_*`` and ``replica_schedule`` events):

* a batch is formed when the first stage is free and fewer than ``stages`` batches are in flight (at the first
  stage's end, at a batch's end, at an arrival), from the requests not in flight;
* each stage is a FIFO: a batch's stage k starts when its stage k - 1 ended and stage k is free; it takes the
  batch's per-stage compute (layers per stage x one layer's time) plus, on every stage but the last, the hop to the
  next stage (the send/recv profile keyed by the batch's tokens);
* a batch's requests get their tokens, and finished ones free their KV, when its last stage ends.

kvstudy's latency models answer a batch's whole time, ``stages x compute + (stages - 1) x hop``
(kvstudy/latency/tables.py), and its hop (``hop_seconds``); the per-stage compute is recovered from the two. Time
the engine adds to an iteration beyond the model's compute (KV copies of swaps, a connector's loads, a handed-off
prompt's pull) is per layer, so it is spread evenly over the stages: each stage moves its own layers' KV.

This module holds the stages' clocks and the batches in flight; the engine (kvstudy/engine/loop.py) hides a batch's
requests from the policy while it is in flight and gives them back when it ends.
"""
from __future__ import annotations

from collections import deque
from typing import List, NamedTuple


class InFlight(NamedTuple):
    """A batch in flight: when its last stage ends, its requests (in batch order), those that produced their last
    token in it, its token stamp, iteration number and its decoders' KV tokens."""
    end: float
    members: List[int]
    finished: list
    stamp: float
    step: int
    kv: int


class Pipeline:
    """The stages' clocks and the batches in flight of one replica (module docstring)."""

    def __init__(self, stages: int) -> None:
        if stages < 2:
            raise ValueError(f"a pipeline has at least 2 stages, got {stages}")
        self.stages = stages
        self.free = [0.0] * stages  # when each stage is free
        self.flight: deque = deque()  # InFlight, oldest first (stages are FIFO: they end in this order)

    def place(self, t: float, total: float, hop: float) -> float:
        """A batch formed at ``t`` whose whole time through the stages is ``total`` seconds (``stages x compute +
        (stages - 1) x hop``; anything beyond the model's compute spread evenly) and whose hop between stages is
        ``hop``: each stage takes it after the stage before it and after the batch ahead of it. Returns when its last
        stage ends."""
        s = self.stages
        compute = (total - (s - 1) * hop) / s
        free, at = self.free, t
        for k in range(s):
            start = free[k] if free[k] > at else at
            at = start + compute + (hop if k < s - 1 else 0.0)
            free[k] = at
        return at

    def next_decision(self, t: float) -> float:
        """The earliest time the next batch may be formed: the first stage is free and fewer than ``stages`` batches
        are in flight (then the oldest has ended)."""
        at = self.free[0] if self.free[0] > t else t
        if len(self.flight) >= self.stages and self.flight[0].end > at:
            at = self.flight[0].end
        return at

    def next_end(self) -> float:
        """When the oldest batch in flight ends (inf: none in flight)."""
        return self.flight[0].end if self.flight else float("inf")
