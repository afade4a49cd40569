"""A decode run's iterations computed as a whole (issue 59, item 4): the stretch of a decode run (loop.py
``_run_on``) in which every running request decodes, nothing arrives and nothing finishes is known in advance, so its
iterations are found with array arithmetic instead of one Python pass each.

For the ``n`` running requests (all on the decode clock, decode_clock.py) with ``g`` tokens now, holding ``h`` blocks of
``block_size`` tokens over their ``s``-token prompts:

* the first finish comes after iteration ``min(o - g) - 1`` of the stretch (the clock's ``finish_at``, read from
  the requests themselves);
* request i needs a block before iteration ``j`` when ``s + g + j > h * block_size``: first at ``j1 = max(0, h *
  block_size - s - g + 1)``, then every ``block_size`` iterations (each time one block: a request that is more than a
  block behind is left to the one-by-one path). So the growing requests per iteration are the counts of ``j1`` folded
  with period ``block_size``, and the blocks free before each iteration their running sum;
* iteration j runs while the blocks grown up to and including it stay within ``free - spare`` (the one-by-one path's
  ``grow_if_room(free - spare)`` and ``spare > free`` are that one inequality, with and without growers), it is not
  past ``engine.max_iterations`` and no earlier iteration ended at or past ``limit`` (the next arrival);
* the seconds are the latency model's ``decode_run_seconds`` (Vidur's tables: bit-identical to one-iteration lookups)
  and the starts their running sum from the last start (``np.cumsum`` adds in order: the same doubles as ``t += dt``).

Then the stretch is committed at once: the clock's ticks, token times and gaps; each grown request's blocks held
once (its final count) and its next boundary scheduled; the rows appended in bulk (records.py ``decode_run``); the
finishing requests read from the clock's bucket at the stretch's last tick. Everything is as the one-by-one path
leaves it: the per-block holds in between are invisible on plain paged memory (a count of blocks in use). With a
prefix cache (whose holds evict cached blocks in order, counted per iteration), an offload tier, the paper's memory,
a latency model without ``decode_run_seconds`` or rows that record more, the engine keeps the one-by-one path
(``for_engine`` returns None). Short stretches (under ``MIN_STRETCH`` iterations) are left to it too: the arrays cost
more than they save there.
"""
from __future__ import annotations

import numpy as np

from kvstudy.engine.records import PagedRows
from kvstudy.memory.paged import PagedMemory

MIN_STRETCH = 12  # iterations: below this the one-by-one path is cheaper (bench/vs_vidur.py speed)
MAX_STRETCH = 4096  # iterations asked at once: the latency lookup and the rows grow with it


def for_engine(engine) -> "DecodeBulk | None":
    """The engine's bulk decode path, or None where the one-by-one path must run (module docstring)."""
    mem, rows = engine.memory, engine.rows
    if (type(mem) is not PagedMemory or type(rows) is not PagedRows or not engine.state.clock.bs
            or engine.run_seconds is None or engine.at_start):
        return None
    return DecodeBulk(engine)


class DecodeBulk:
    def __init__(self, engine) -> None:
        self.state, self.memory, self.rows = engine.state, engine.memory, engine.rows
        self.clock = engine.state.clock
        self.run_seconds, self.overlap = engine.run_seconds, engine.overlap

    def advance(self, t: float, dt: float, stamp: float, ctx: int, n: int, limit: float, max_run: int, run: int,
                spare: int):
        """The decode run's iterations after the one that started at ``t`` and took ``dt`` (its decoders holding
        ``ctx`` tokens of context before it, its tokens stamped ``stamp``; ``run`` iterations so far), as far as the one-by-one path would go in
        one stretch of at most ``MAX_STRETCH``. Returns None when the stretch would be short (the caller goes one by
        one), else (the last iteration's start, seconds, stamp, the requests that finished in it, its decoders'
        context before it, iterations in all, whether the run ended)."""
        clock, running = self.clock, self.state.running
        D0, finish_at = clock.ticks, clock.finish_at
        K = min(max_run - run, MAX_STRETCH)
        if dt > 0.0 and limit - t < (K + 1) * dt:  # the next arrival is nearer: about (limit - t) / dt iterations
            K = min(K, int((limit - t) / dt) + 2)
        if K < MIN_STRETCH or clock.size != n:  # (the clock holds just the running requests in a decode run)
            return None
        for D in range(D0 + 1, D0 + MIN_STRETCH + 1):  # a finish may be near (or a stale entry): one by one
            if D in finish_at:
                return None
        tokens, joined, s, o, held, bs = clock.tokens, clock.joined_at, clock.s, clock.o, clock.held, clock.bs
        g = [tokens[i] + D0 - joined[i] for i in running]
        K = min(K, min([o[i] - gi for i, gi in zip(running, g)]))  # up to and including the first finish
        need = np.array([s[i] + gi - held.get(i, 0) * bs for i, gi in zip(running, g)])
        if K < MIN_STRETCH or need.max() > bs:  # a request more than a block behind takes several: one by one
            return None
        seconds = self.run_seconds(n, ctx + n, K)
        K = len(seconds)  # shorter past the trained range: the one-by-one path raises there
        if K < MIN_STRETCH:
            return None
        dts = np.array(seconds)
        dts = np.maximum(dts, 0.0) if self.overlap else dts + 0.0
        T = np.cumsum(np.concatenate(((t, dt), dts)))  # T[j + 1]: iteration j's start, T[j + 2] its end
        late = np.flatnonzero(T[2:] >= limit)  # iterations up to the first that ends at or past the limit
        E = int(late[0]) + 1 if late.size else K
        # growers per iteration: the first boundaries j1 folded with period bs, then their running sum
        j1 = np.maximum(1 - need, 0)
        rows = -(-K // bs)
        fold = np.bincount(j1[j1 < K], minlength=rows * bs)
        grown = fold.reshape(rows, bs).cumsum(axis=0).ravel()[:K].cumsum()  # blocks taken up to each iteration
        E = min(E, int(grown.searchsorted(self.memory.free - spare, side="right")))
        if E == 0:  # the first iteration's growers would not find their blocks: the policy decides
            return t, dt, stamp, [], ctx, run, True
        self._commit(D0, E, g, j1, T[:E + 2], dts[:E], ctx, n, grown[:E])
        finished = self._finished(D0 + E)
        t_last, dt_last = float(T[E]), float(dts[E - 1])
        run += E
        done = E < K or bool(finished) or run >= max_run or t_last + dt_last >= limit
        return t_last, dt_last, t_last + dt_last, finished, ctx + n * E, run, done

    def _commit(self, D0: int, E: int, g: list, j1, T, dts, ctx: int, n: int, grown) -> None:
        """E iterations happen (``T``: the last start before them, then their starts and the last one's end): the
        clock's ticks and token times, the grown requests' blocks and next boundaries, the rows."""
        clock, running = self.clock, self.state.running
        stamps = T[2:].tolist()  # the iterations' token times (their ends: start + seconds, as ``T`` adds them)
        if clock.track_gaps:
            gaps = (T[2:] - T[1:-1]).tolist()  # each end less the one before (T[1]: the last iteration's end)
            gaps[0] = stamps[0] - clock.ends[-1] if clock.ends else 0.0
            clock.gaps.extend(gaps)
        clock.ends.extend(stamps)
        clock.ticks = D0 + E
        finish_at, grow_at = clock.finish_at, clock.grow_at
        grow_at.pop(D0, None)
        for D in range(D0 + 1, D0 + E):  # no request finishes before the stretch's last iteration: stale entries
            finish_at.pop(D, None)
            grow_at.pop(D, None)
        bs, o = clock.bs, clock.o
        who = np.flatnonzero(j1 < E)
        first = j1[who]
        times = (E - 1 - first) // bs + 1  # boundaries crossed in the stretch, one block each
        after = (first + times * bs).tolist()  # the next boundary, as the clock's ``grow`` schedules it
        who = who.tolist()
        grew = [running[k] for k in who]
        self.memory.grow_many(grew, times.tolist())
        for k, i, a in zip(who, grew, after):
            if g[k] + a < o[i]:
                grow_at[D0 + a].append(i)
        used = self.memory.used
        self.rows.decode_run(T[1:-1].tolist(), dts.tolist(), n, range(ctx + 2 * n, ctx + (E + 2) * n, n),
                             (grown + (used - int(grown[-1]))).tolist())

    def _finished(self, D: int) -> list:
        """The requests whose last token the stretch's last iteration produced (the clock's ``tick`` at count D)."""
        clock = self.clock
        due = clock.finish_at.pop(D, None)
        if not due:
            return []
        tokens, joined, on_clock, o = clock.tokens, clock.joined_at, clock.on_clock, clock.o
        return list({i for i in due if on_clock[i] and tokens[i] + D - joined[i] == o[i]})
