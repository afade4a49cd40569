"""Tokens of the requests that decode in every iteration, counted without visiting each request per step.

In vLLM's and Sarathi's schedules every running request past its prefill decodes in every iteration that
decodes at all (a ``decode_all`` decision). The clock counts those iterations (``ticks``); a request that
joined it at tick ``joined_at[i]`` with ``tokens[i]`` tokens has ``tokens[i] + ticks - joined_at[i]`` tokens now. Its next
completion and its next block boundary are known in advance, so they are kept in buckets keyed by the
count at which they happen: an iteration costs O(1) plus the requests that finish or grow in it, not
O(running). The time of every counted iteration's tokens is kept (``ends``), so each request's largest
gap between tokens is computed when it leaves the clock (preempted, finished, or an iteration that
decodes only some requests), from the range of iterations it decoded in.

Every gap between a request's tokens is also counted for the pooled distribution of time between tokens (the
CacheOPT spec's tail TBT, B8.11): a request's first gap on the clock is kept as a value, and its later gaps are
the iterations' own gaps, counted by how many requests decoded in each (a difference array over the count), so
recording costs O(1) per request leaving the clock.

Bucket entries are never removed when a request leaves; each is checked against the request's state when
its count comes (a stale entry fails the check or repeats a valid one, and duplicates are dropped).
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np


class DecodeClock:
    def __init__(self, n: int, prompt, output, block_size: int, held: dict, last_token: list, max_gap: list,
                 gaps: bool = True, per_request=None) -> None:
        """``ticks``: counted iterations so far; per request ``tokens`` (produced tokens: exact off the clock, at
        joining while on it), ``joined_at`` (the tick it joined at), ``on_clock``; ``size``: requests on the clock.
        ``held`` is the memory's per-request blocks (read for block boundaries); ``per_request(name, value)`` makes
        a per-request list (RunState's: a cluster's replicas share them). ``gaps`` false: no gap between tokens is kept (the paper's records compute time between tokens from the
        iterations' stamps instead, kvstudy/engine/records.py)."""
        self.track_gaps = gaps
        self.ticks = 0
        per_request = per_request or (lambda name, value: [value] * n)  # a cluster's shared lists (RunState)
        self.tokens = per_request("tokens", 0)
        self.joined_at = per_request("joined_at", 0)
        self.on_clock = per_request("on_clock", False)
        self.size = 0
        self.s, self.o, self.bs, self.held = prompt, output, block_size, held
        self.last_token, self.max_gap = last_token, max_gap
        self.ends = []  # ends[k]: token time of the counted iteration that took ticks from k to k + 1
        self.gaps = []  # gaps[k] = ends[k] - ends[k - 1] (gaps[0] unused)
        self.finish_at = defaultdict(list)  # ticks after the iteration -> requests producing their last token
        self.grow_at = defaultdict(list)  # ticks before the iteration -> requests needing a block to decode
        self.first_gaps = []  # each stint's first gap on the clock (from the token before it)
        self.cover = defaultdict(int)  # difference array: how many requests' gaps include gaps[k]

    def generated(self, i: int) -> int:
        return self.tokens[i] + self.ticks - self.joined_at[i] if self.on_clock[i] else self.tokens[i]

    def _next_growth(self, i: int, g: int) -> None:
        """Schedule the first count at which request i (g tokens now) needs a block beyond what it holds (never
        with ``block_size`` 0: memory counted in aggregate, the paper's model)."""
        if not self.bs:
            return
        g_star = max(g, self.held.get(i, 0) * self.bs - self.s[i] + 1)
        if g_star < self.o[i]:  # the last decode runs with o - 1 tokens
            self.grow_at[self.ticks + g_star - g].append(i)

    def start(self, i: int, g: int) -> None:
        """Request i, with g tokens, decodes in every counted iteration from now on."""
        self.tokens[i], self.joined_at[i], self.on_clock[i] = g, self.ticks, True
        self.size += 1
        self.finish_at[self.ticks + self.o[i] - g].append(i)
        if self.bs:
            self._next_growth(i, g)

    def stop(self, i: int) -> int:
        """Request i leaves the clock: its tokens and token gaps are written back; returns its tokens."""
        joined, D = self.joined_at[i], self.ticks
        if D > joined and self.track_gaps:
            first = self.ends[joined] - self.last_token[i]
            self.first_gaps.append(first)
            if D - joined > 1:
                self.cover[joined + 1] += 1
                self.cover[D] -= 1
            worst = max(first, max(self.gaps[joined + 1:D])) if D - joined > 1 else first
            if worst > self.max_gap[i]:
                self.max_gap[i] = worst
            self.last_token[i] = self.ends[D - 1]
        g = self.tokens[i] + D - joined
        self.tokens[i], self.on_clock[i] = g, False
        self.size -= 1
        return g

    def pooled_gaps(self):
        """(values, weights) of every gap between tokens produced on the clock (the caller adds its own)."""
        w = np.zeros(len(self.gaps) + 1)
        for k, c in self.cover.items():
            w[k] += c
        w = np.cumsum(w)[:len(self.gaps)]
        return np.concatenate([np.asarray(self.gaps), np.asarray(self.first_gaps)]), \
            np.concatenate([w, np.ones(len(self.first_gaps))])

    def growing(self) -> set:
        """Requests that need one more block to decode in this count's iteration."""
        due = self.grow_at.get(self.ticks)
        if not due:
            return set()
        held, s, bs, on_clock = self.held, self.s, self.bs, self.on_clock
        D = self.ticks
        if len(due) > 64:  # entries of requests that left the clock (or joined it again) since they were scheduled:
            # steps that decode a list (no tick, e.g. a pipeline's cut batches) would pile them up at this count and
            # walk them every step; only the requests on the clock matter (every reader takes them as a set)
            due = self.grow_at[D] = list({i for i in due if on_clock[i]})
        return {i for i in due if on_clock[i] and s[i] + self.tokens[i] + D - self.joined_at[i] > held.get(i, 0) * bs}

    def grow_if_room(self, hold, room: int) -> bool:
        """This count's growing requests (``growing``) take their blocks (``grow``) if they are at most ``room``;
        returns whether they did (a decode run's step in one call: kvstudy/engine/loop.py ``_decode_run``)."""
        due = self.growing()
        if len(due) > room:
            return False
        self.grow(due, hold)
        return True

    def grow(self, grew, hold) -> None:
        """The requests in ``grew`` take the block their context grew into in this count's iteration
        (``hold(request, blocks)``: the memory model's), and their next boundary is scheduled (``_next_growth``,
        inlined: this runs for every block every request fills)."""
        D, bs, s, o, held, grow_at = self.ticks, self.bs, self.s, self.o, self.held, self.grow_at
        tokens, joined = self.tokens, self.joined_at
        grow_at.pop(D, None)
        for i in grew:
            g = tokens[i] + D - joined[i]
            hold(i, (s[i] + g + bs - 1) // bs)
            g_star = held[i] * bs - s[i] + 1
            if g_star < g:
                g_star = g
            if g_star < o[i]:
                grow_at[D + g_star - g].append(i)

    def reschedule_growth(self, i: int) -> None:
        """Request i's holding changed (a reservation): its next boundary moves."""
        if self.on_clock[i]:
            self._next_growth(i, self.generated(i))

    def tick(self, end: float) -> list:
        """A counted iteration ended at ``end``: every clocked request produced a token. Returns the
        requests whose last token that was (still on the clock; the caller stops them)."""
        if self.track_gaps:
            self.gaps.append(end - self.ends[-1] if self.ends else 0.0)
        self.ends.append(end)
        self.ticks += 1
        due = self.finish_at.pop(self.ticks, None)
        if not due:
            return []
        o, D = self.o, self.ticks
        return list({i for i in due if self.on_clock[i] and self.tokens[i] + D - self.joined_at[i] == o[i]})
