"""Incremental check of the MC-SF feasibility inequality, eq. (5).

At round t every request in S (running) or U (being added) holds, at a future round t + tau,
``w_i + tau`` KV tokens while ``tau <= d_i`` and nothing after, where

* a running request that has completed j decode rounds: w = s + j + 1, d = o~ - j - 1;
* a new request started in round t: w = s, d = o~.

Eq. (5) asks memory(tau) = sum_{d_i >= tau} (w_i + tau) <= M for tau in [1, max d]. Memory is linear
between completion points and drops after them, so it suffices to check tau in {d_j} (the paper's
argument after eq. (6)). ``FutureMemory`` keeps the memory at every check point; adding one candidate
costs O(K) vector work for K check points, so a round is O(K * |U|) rather than the O(M^2) bound of
Prop. 4.2. Running requests past their predicted end (d < 1) drop out, exactly as the indicator in
eq. (5) does.

``steps`` generalises what a request gains by a check point: eq. (5) adds tau tokens at point tau; the MC-SF
authors' scripts add ``authors_steps`` of it (``AuthorsCheck`` below, docs/authors_code.md).
"""
from __future__ import annotations

import numpy as np


class FutureMemory:
    def __init__(self, capacity: int, running_w: np.ndarray, running_d: np.ndarray, steps=None, ids=None) -> None:
        """``steps(points)``: the tokens a request still running at each check point has gained by then (an
        int64 array for an int64 array; None: the point itself, eq. (5)). ``ids``: optional names of the running
        requests, kept aligned with ``w`` and ``d`` (what ``remove`` takes)."""
        self.capacity = capacity
        self.steps = steps
        keep = running_d >= 1
        w, d = running_w[keep].astype(np.int64), running_d[keep].astype(np.int64)
        # the terms kept sorted by d (ties in the given order): those that end drop out as a prefix (``_move``)
        order = np.argsort(d, kind="stable")
        self.w, self.d = w[order], d[order]
        self.ids = None if ids is None else _sorted_ids(ids, keep, order)
        self.joined = []  # names added by ``try_add`` since this check was built or moved on
        if len(self.d):
            d_sorted, w_sorted = self.d, self.w
            # the distinct check points, as np.unique gives them, from the sort done anyway (np.unique costs a
            # second sort per round; this loop runs every iteration)
            distinct = np.empty(len(d_sorted), dtype=bool)
            distinct[0] = True
            np.not_equal(d_sorted[1:], d_sorted[:-1], out=distinct[1:])
            pts = d_sorted[distinct]
            # Suffix sums over requests with d >= tau for each check point tau.
            suffix_w = np.concatenate((np.cumsum(w_sorted[::-1])[::-1], [0]))
            first = np.searchsorted(d_sorted, pts, side="left")
            count = len(d_sorted) - first
            # what a request still running at each point has gained by then (kept beside pts, not recomputed per try)
            gained = pts if steps is None else steps(pts)
            mem = suffix_w[first] + gained * count
        else:
            pts = gained = mem = np.empty(0, dtype=np.int64)
        self.pts, self.gained, self.mem = pts, gained, mem
        self._refused = None  # (w, d, rounds): a candidate known to be refused for that many more rounds (try_add)

    def shifted(self, rounds: int) -> "FutureMemory":
        """This check ``rounds`` decode rounds later, when every running request has decoded that many more tokens:
        each w rises and each d falls by ``rounds``, so at a point tau - rounds memory is what it was at tau (the same
        requests, each holding as much): the points move down by ``rounds``, those below 1 drop out, and memory at
        the rest is unchanged. Exact (integers), also for a check candidates were added to (each then counts as a
        running request). What MC-SF's policy moves its kept check on with (issue 47); only for eq. (5) itself
        (``steps`` None)."""
        out = FutureMemory.__new__(FutureMemory)
        out.capacity, out.steps = self.capacity, None
        _move(self, out, rounds)
        out.gained = out.pts
        out._refused = _still_refused(self._refused, rounds)
        return out

    def remove(self, gone) -> None:
        """Take the requests named in ``gone`` (a set of ``ids``) out of the check: memory at each point loses their
        w + tau, and points where no request is left to end are dropped, so the check is the one built for the rest
        (exact, eq. (5) only). MC-SF's kept check loses the requests that finished since (issue 47)."""
        if _remove(self, gone, lambda w, pts: w + pts):
            self.gained, self._refused = self.pts, None

    def fits(self) -> bool:
        return bool(len(self.mem) == 0 or self.mem.max() <= self.capacity)

    def try_add(self, w: int, d: int, name=None) -> bool:
        """Add a request starting now with prompt w and predicted output d if eq. (5) still holds (``name``: its id,
        when the check keeps ``ids``).

        The candidate adds w + gained at the first k points (those <= d, the points sorted) and nothing after.

        A refusal at a point p <= d by e tokens (memory there with the candidate M + e) holds, on eq. (5) itself, for
        the same candidate while the check is only moved on (``shifted``): r rounds later the point p - r has the same
        memory (the same requests still hold what they held at p), and the candidate adds r fewer tokens there, so it
        is refused for every r < min(e, p). The check remembers that bound (``_refused``) and answers the same
        candidate at once until it runs out, is taken out (``remove``) or another is added: MC-Benchmark's head of the
        queue waits many rounds, refused each (issue 59 item 2). Exact: the answer is the one computed in full."""
        ref = self._refused
        if ref is not None and ref[0] == w and ref[1] == d:
            return False
        pts, mem, capacity = self.pts, self.mem, self.capacity
        k = int(pts.searchsorted(d, "right"))
        if k:
            head = mem[:k] + (w + self.gained[:k])
            top = int(head.argmax())
            if int(head[top]) > capacity:
                if self.steps is None:
                    self._refused = (w, d, min(int(head[top]) - capacity, int(pts[top])))
                return False
        if k < len(pts) and int(mem[k:].max()) > capacity:
            return False
        if not (k and pts[k - 1] == d):
            j = int(self.d.searchsorted(d, "left"))  # the requests with d_i >= d: a suffix
            g = d if self.steps is None else int(self.steps(np.array([d], dtype=np.int64))[0])
            at_d = int(self.w[j:].sum()) + g * (len(self.d) - j) + w + g
            if at_d > capacity:
                return False
            # concatenated slices, not np.insert / np.append: the same arrays at a sixth of the cost on these sizes
            self.mem = np.concatenate((head, [at_d], mem[k:])) if k else np.concatenate(([at_d], mem))
            self.pts = np.concatenate((pts[:k], [d], pts[k:]))
            self.gained = self.pts if self.steps is None else np.concatenate((self.gained[:k], [g], self.gained[k:]))
        else:
            self.mem = np.concatenate((head, mem[k:]))
        self._refused = None
        _insert(self, int(self.d.searchsorted(d, "right")), w, d, name)
        return True


def _still_refused(ref, rounds: int):
    """A remembered refusal (w, d, rounds it holds for) ``rounds`` later: what is left of it, or None."""
    return None if ref is None or ref[2] <= rounds else (ref[0], ref[1], ref[2] - rounds)


def _sorted_ids(ids, keep, order) -> list:
    """``ids`` of the kept requests (``keep``), in the order ``order`` sorts them."""
    kept = [i for i, k in zip(ids, keep.tolist()) if k]
    return [kept[o] for o in order.tolist()]


def _insert(check, at: int, w: int, d: int, name) -> None:
    """A new term (w, d) and its name into ``check``'s terms at position ``at`` (after any with the same d: the
    terms stay sorted by d, ties in the order they joined)."""
    check.w = np.concatenate((check.w[:at], [w], check.w[at:]))
    check.d = np.concatenate((check.d[:at], [d], check.d[at:]))
    if check.ids is not None:
        check.ids.insert(at, name)
        check.joined.append(name)


def _move(check, out, rounds: int) -> None:
    """``out``'s terms, points and memory: ``check``'s ``rounds`` decode rounds later (each w + rounds, each d -
    rounds; points below 1 and requests past their end out; memory at the others unchanged). The terms are sorted by
    d, so those past their end are a prefix, sliced off. Its arrays are never changed in place, so ``rounds`` 0 shares
    them. Both checks' ``shifted``."""
    out.joined = []
    if rounds == 0:
        out.w, out.d, out.pts, out.mem = check.w, check.d, check.pts, check.mem
        out.ids = None if check.ids is None else list(check.ids)  # try_add inserts into it
        return
    gone = int(check.d.searchsorted(1 + rounds))
    out.w, out.d = check.w[gone:] + rounds, check.d[gone:] - rounds
    out.ids = None if check.ids is None else check.ids[gone:]
    first = int(check.pts.searchsorted(1 + rounds))
    out.pts = check.pts[first:] - rounds
    out.mem = check.mem[first:]


def _remove(check, gone, held) -> bool:
    """Take the requests named in ``gone`` out of ``check``: memory at each point up to a request's end loses
    ``held(w, points)``, and points where nobody is left to end are dropped. Both checks' ``remove``; returns whether
    anything changed."""
    out = [k for k, i in enumerate(check.ids) if i in gone]
    if not out:
        return False
    mem, pts = check.mem.copy(), check.pts
    for k in out:
        upto = int(np.searchsorted(pts, check.d[k], side="right"))
        mem[:upto] -= held(check.w[k], pts[:upto])
    keep = np.ones(len(check.ids), dtype=bool)
    keep[out] = False
    check.w, check.d = check.w[keep], check.d[keep]
    check.ids = [i for i in check.ids if i not in gone]
    ends = np.isin(pts, check.d)
    check.mem, check.pts = mem[ends], pts[ends]
    return True


def running_terms(view) -> tuple:
    """(w, d) of eq. (5) for the running requests of a ``SchedulerView``."""
    w = view.running_prompt + view.running_generated + 1
    d = view.running_predicted - view.running_generated - 1
    return w, d


def authors_steps(now: float, batch_time: float):
    """The tokens the MC-SF authors' look-ahead credits a request with by the check point k batches ahead, as their
    floating-point arithmetic computes it: the point is the time ``now + k * batch_time``, and the batches elapsed by
    then are that time minus ``now``, floor-divided by ``batch_time``. That is k, or k - 1 when the two roundings
    land just below (now = 1.0, batch_time = 0.05, k = 3 gives 2; with 0.05 it happens at about half of all
    points). numpy's float64 floor division is Python's
    (tests/policies/test_authors_code.py checks both against Python floats)."""
    def steps(points: np.ndarray) -> np.ndarray:
        at = now + points * batch_time
        return ((at - now) // batch_time).astype(np.int64)
    return steps


class AuthorsCheck:
    """The look-ahead memory check of the MC-SF authors' ``MC-SF.py`` and ``MC-Benchmark.py`` (real-data study),
    as a ``FutureMemory`` with other terms. Their scripts differ from eq. (5) in two ways:

    * a request is counted at the very instant it completes: at the point of its last token it still holds
      s + o + 1 (its prompt's first token counted as held KV), so its check point is one batch later than eq. (5)'s:
      d = o - j instead of o - j - 1 for a running request after j decodes, o + 1 instead of o for a new one;
    * the tokens gained by a point come from ``authors_steps`` (their time arithmetic), not the point itself.

    A request's completion time in the scripts, ``now + (o + 1 - tokens) * batch_time``, orders requests like
    their remaining batches for any batch_time >= 1e-4 s (their 1e-6 s tolerance never merges two), so the active
    set at a point is the requests with d >= point, as here.
    """

    def __init__(self, budget: int, running_w: np.ndarray, running_d: np.ndarray, now: float, batch_time: float):
        self.memory = FutureMemory(budget, running_w, running_d + 1, steps=authors_steps(now, batch_time))

    def try_add(self, prompt: int, predicted: int) -> bool:
        return self.memory.try_add(prompt, predicted + 1)


class BlockFutureMemory:
    """Eq. (5) on paged memory (issue 34): each request's KV rounded up to whole blocks, and the current iteration
    charged (a prefill holds its prompt's blocks while it runs, unlike the paper's constraint (3)).

    Same terms as :class:`FutureMemory` (a running request holds ``w + tau`` tokens at point tau while tau <= d; a new
    one ``w + tau`` from its prefill at tau = 0), but memory at a point is sum(ceil((w_i + tau) / block_size)) blocks,
    against ``budget // block_size``. Each term is non-decreasing in tau, so memory still peaks at completion points:
    checking tau = 0 and every d_j suffices, as after eq. (6). Point 0 starts from ``now_blocks``, the blocks the
    running requests need this iteration (so a request past its predicted end still counts now).

    Cost: the memory at every point from the running requests in O(N x block_size + K log N) (``_blocks_at``), then
    O(K) per candidate plus O(N) when it adds a point (N requests kept, K points)."""

    def __init__(self, budget: int, running_w: np.ndarray, running_d: np.ndarray, block_size: int,
                 now_blocks: int, ids=None) -> None:
        """``ids``: optional names of the running requests, kept aligned with ``w`` and ``d`` (what ``remove`` takes)."""
        self.bs = int(block_size)
        self.capacity = int(budget) // self.bs
        keep = running_d >= 1
        w, d = running_w[keep].astype(np.int64), running_d[keep].astype(np.int64)
        order = np.argsort(d, kind="stable")  # sorted by d, as FutureMemory's terms
        self.w, self.d = w[order], d[order]
        self.ids = None if ids is None else _sorted_ids(ids, keep, order)
        self.joined = []
        self.now = int(now_blocks)
        self._refused = None  # (w, d, rounds): a candidate known to be refused for that many more rounds (try_add)
        self.pts = np.unique(self.d)
        self.mem = self._blocks_at(self.w, self.d, self.pts, self.bs)

    def shifted(self, rounds: int, now_blocks: int) -> "BlockFutureMemory":
        """This check ``rounds`` decode rounds later, the running requests needing ``now_blocks`` now: as
        ``FutureMemory.shifted``, since a request's blocks at point tau - rounds, ceil((w + rounds + tau - rounds) /
        block_size), are its blocks at tau before; point 0 is the present, given (issue 59: MC-SF on paged memory keeps
        its check as on the paper's)."""
        out = BlockFutureMemory.__new__(BlockFutureMemory)
        out.bs, out.capacity, out.now = self.bs, self.capacity, int(now_blocks)
        _move(self, out, rounds)
        out._refused = _still_refused(self._refused, rounds)
        return out

    def remove(self, gone) -> None:
        """Take the requests named in ``gone`` out of the check, as ``FutureMemory.remove`` (their blocks at every point
        up to their end subtracted, points where nobody is left to end dropped): the check built for the rest."""
        bs = self.bs
        if _remove(self, gone, lambda w, pts: (w + pts + bs - 1) // bs):
            self._refused = None

    @staticmethod
    def _blocks_at(w: np.ndarray, d: np.ndarray, pts: np.ndarray, bs: int) -> np.ndarray:
        """sum over {i: d_i >= p} of ceil((w_i + p) / bs), for each point p. With w = bs q + r and p = bs a + b
        (0 <= r, b < bs): ceil((w + p) / bs) = q + a + [r + b >= 1] + [r + b >= bs + 1]; so over the active set
        it is sum(q) + count x a + #{r >= 1 - b} + #{r >= bs + 1 - b}, from prefix sums over the requests sorted by d
        descending (the active set at p is a prefix) and, per prefix, counts of each remainder."""
        if not len(pts):
            return np.empty(0, dtype=np.int64)
        order = np.argsort(-d, kind="stable")
        q, r = np.divmod(w[order], bs)
        active = np.searchsorted(-d[order], -pts, side="right")  # how many have d >= p
        sum_q = np.concatenate(([0], np.cumsum(q)))
        # at_least[k, t] = #{first k requests with r >= t}, t = 0 .. bs (t = bs: none)
        onehot = np.zeros((len(q) + 1, bs + 1), dtype=np.int64)
        onehot[np.arange(1, len(q) + 1), r] = 1
        at_least = np.cumsum(np.cumsum(onehot[:, ::-1], axis=1)[:, ::-1], axis=0)
        a, b = np.divmod(pts, bs)
        first = at_least[active, np.where(b >= 1, 0, 1)]  # r >= 1 - b: everyone when b >= 1
        second = at_least[active, np.minimum(bs + 1 - b, bs)]  # r >= bs + 1 - b: nobody when b = 0
        return sum_q[active] + active * a + first + second

    def try_add(self, w: int, d: int, name=None) -> bool:
        """Add a request whose prefill of w tokens starts now and that then decodes d more rounds, if eq. (5) in
        blocks still holds at tau = 0 and at every point (``name``: its id, when the check keeps ``ids``; a request
        with d < 1 counts at tau = 0 only and is not kept, as a running one past its predicted end)."""
        bs, capacity = self.bs, self.capacity
        now = self.now + (w + bs - 1) // bs
        if now > capacity:
            return False
        ref = self._refused
        if ref is not None and ref[0] == w and ref[1] == d:
            return False
        pts, mem = self.pts, self.mem
        k = int(pts.searchsorted(d, "right"))
        if k:
            head = mem[:k] + (w + pts[:k] + bs - 1) // bs
            top = int(head.argmax())
            if int(head[top]) > capacity:
                # refused by e blocks at point p: r rounds later the candidate adds at most ceil(r / bs) fewer blocks
                # at p - r (ceil is subadditive), so the refusal holds while ceil(r / bs) < e and r < p (as
                # FutureMemory.try_add's)
                self._refused = (w, d, min((int(head[top]) - capacity - 1) * bs + 1, int(pts[top])))
                return False
        if k < len(pts) and int(mem[k:].max()) > capacity:
            return False
        self._refused = None
        at_pts = np.concatenate((head, mem[k:])) if k else mem
        if d >= 1:
            if not (k and pts[k - 1] == d):  # a new point d, after the k points before it
                at_d = int(((self.w[int(self.d.searchsorted(d)):] + d + bs - 1) // bs).sum()) + (w + d + bs - 1) // bs
                if at_d > capacity:
                    return False
                at_pts = np.concatenate((at_pts[:k], [at_d], at_pts[k:]))  # np.insert's result, cheaper
                self.pts = np.concatenate((pts[:k], [d], pts[k:]))
            _insert(self, int(self.d.searchsorted(d, "right")), w, d, name)
        self.mem, self.now = at_pts, now
        return True
