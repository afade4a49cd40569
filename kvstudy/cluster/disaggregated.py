"""Prefill/decode disaggregation on one clock (issue 57; docs/disaggregation.md): a prefill pool and a decode pool,
each replica a :class:`~kvstudy.engine.loop.StepEngine` of its own, and the handoffs between them.

A prefill replica's engine serves each request's prefill part (its requests' outputs are 1: the prefill makes token
1, and TTFT is its end); a request with more tokens keeps its blocks when that part finishes (``RunState.hold``) and
is handed off: at that instant the driver posts it into a decode replica's queue (``RunState.inbox``, delivered by
the engine's ``_deliver`` at its clock), where the decode policy admits it as any request with one token generated
whose prompt's KV is supplied; that admission pulls the KV (kvstudy/cluster/handoff.py), and the prefill replica's
blocks are freed when the transfer ends (another posted event).

How the clock is shared: everything happens in one order, by time (a driver's event, an arrival or a handoff or a
sleeping replica's alarm, before a decision at its instant; decisions at one instant by replica index, prefill
replicas first): so a handoff is routed with the decode pool as it stands at the prefill's end, a pull happens
before the prefill replica decides anything after it, and a release reaches the prefill replica before its first
decision after the transfer's end. The driver does the earliest thing next, an event when it comes no later than
every replica's next decision, else the replica whose clock is earliest runs up to its *horizon*: the earliest time
something another replica does next could reach it (conservative lookahead, as parallel discrete-event simulators
bound each process by its senders' clocks). What reaches whom:

* a decode replica hears from the prefill replicas (a handoff ends a prefill after that replica's next decision);
  from a sleeping prefill replica with requests waiting for blocks through the other decode replicas holding its
  requests (their pull frees blocks, which wakes it, and it hands off after); and, for a decision that may pull,
  from the decode replicas that pull from the same prefill replica (one link, first come first served: their pulls
  must happen in time order; ``StepEngine.pull_limit``);
* a prefill replica hears from the decode replicas holding requests it handed off and not yet pulled (each pull
  posts the release of its blocks);
* a replica pauses after every iteration that handed off or pulled (the driver routes the handoff, or posts the
  release, before it decides again).

So a decode replica runs its decode-only iterations in one run between two prefill decisions (kvstudy/engine/loop.py
``_decode_run``), where running every replica one iteration at a time gives the same result slower (the order above is
the same; tests/cluster/test_disaggregation.py checks both drivers agree).

Who goes where (``cluster.handoff``): the decider (``always``, ``never``, ``short_prompt``, ``prefix``) says at
arrival whether a request is disaggregated or runs whole on a decode replica; the flow says when its decode replica
is picked (``prefill_first``: at the handoff, by the decode pool's router; ``decode_first``: at arrival).
"""
from __future__ import annotations

import math
from heapq import heappop, heappush
from typing import List, Sequence

import numpy as np
import pandas as pd

from kvstudy.cluster.driver import ReplicaView, _checked, stop_all
from kvstudy.cluster.handoff import HandoffSettings
from kvstudy.engine.loop import IDLE
from kvstudy.engine.states import ELSEWHERE, REJECTED
from kvstudy.errors import KvStudyError


class Split:
    """Each request's path, filled in by :func:`drive_split`: its prefill replica (-1: none, it ran whole on a decode
    replica), its final replica (-1: rejected everywhere), the prefill's end (NaN: not handed off)."""

    def __init__(self, n: int) -> None:
        self.prefill = np.full(n, -1, dtype=np.int64)
        self.final = np.full(n, -1, dtype=np.int64)
        self.handed_at = np.full(n, math.nan)


def drive_split(prefill: Sequence, decode: Sequence, routers, arrival: Sequence[float], output: Sequence[int],
                prompt: Sequence[int], settings: HandoffSettings, lockstep: bool = False):
    """Step the prefill replicas (``prefill``, engines over the prefill parts) and the decode replicas (``decode``,
    engines over the whole requests, each with its ``handoff``) on one clock. ``routers``: (the prefill pool's, the
    decode pool's). ``lockstep``: run the earliest replica only up to the next one's clock, not to its horizon (the
    same result, slower: the check of the horizons). Returns (each engine's result, prefill replicas first; the
    :class:`Split`)."""
    engines = list(prefill) + list(decode)
    n_p, size, n = len(prefill), len(prefill) + len(decode), len(arrival)
    p_router, d_router = routers
    names = [getattr(r, "name", type(r).__name__) for r in routers]
    loops = [e.loop() for e in engines]
    results: List = [None] * size
    now = [0.0]
    views = [ReplicaView(e, now) for e in engines]
    split = Split(n)
    heap: list = []  # (clock of its next decision, replica)
    clock = [math.inf] * size  # each awake replica's next decision (inf: asleep or done)
    asleep: set = set()
    # handed-off requests routed to a decode replica and not pulled yet: by prefill replica -> {decode replica: how
    # many} (who can reach whom, module docstring)
    unpulled_to = [dict() for _ in range(n_p)]
    hand: list = []  # handoffs due: (prefill's end, seq, request, prefill replica)
    alarms: list = []  # (time, replica): a sleeping replica with an event posted for then
    chosen = {}  # request -> its decode replica, picked at arrival (decode_first, the prefix decider)
    seq = [0]

    def resume(r: int, value=None) -> None:
        try:
            t = loops[r].send(value)
        except StopIteration as stop:
            results[r], clock[r] = stop.value, math.inf
            if stop.value.status == "interrupted":
                raise KeyboardInterrupt from None
            return
        if t == IDLE:
            asleep.add(r)
            clock[r] = math.inf
            inbox = engines[r].state.inbox
            if inbox:  # idle until an event posted to it (a release of blocks): woken then, in time order
                heappush(alarms, (inbox[0][0], r))
        else:
            heappush(heap, (t, r))
            clock[r] = t
        collect(r)

    def post(r: int, time: float, kind: str, i: int, payload=None) -> None:
        seq[0] += 1
        heappush(engines[r].state.inbox, (time, seq[0], kind, i, payload))
        if r in asleep:  # a sleeping replica wakes at the event, when the driver's clock reaches it
            heappush(alarms, (time, r))

    def collect(r: int) -> None:
        """What replica r did since it was resumed: prefills that ended holding their KV (handoffs due), pulls that
        started (the prefill replica frees the blocks when each ends)."""
        st = engines[r].state
        if r < n_p:
            if st.handed:
                for stamp, i in st.handed:
                    seq[0] += 1
                    heappush(hand, (stamp, seq[0], i, r))
                st.handed.clear()
            return
        started = engines[r].handoff.started
        if started:
            for i, src, end in started:
                post(src, end, "release", i)
                _less(unpulled_to[src], r)
            started.clear()

    def horizon(r: int, t: float, due: float) -> float:
        """How far replica r (the earliest, deciding next at t) may run: decisions before the returned time, none
        of which anything another replica does next can reach (module docstring); a decode replica's pulls are held
        to its ``pull_limit`` as well. Another replica's next decision at c bounds r by c when it comes first at c
        (a lower index), else just past c; r decides at t at least."""
        bound, least = due, math.nextafter(t, math.inf)
        if r < n_p:
            for d in unpulled_to[r]:  # decode replicas that will pull from r (and post the release of its blocks)
                bound = min(bound, math.nextafter(clock[d], math.inf))
            return max(bound, least)
        for p in range(n_p):  # a prefill replica's next handoff ends an iteration that starts at its next decision
            if clock[p] != math.inf:
                if clock[p] + soonest[p] < bound:
                    bound = clock[p] + soonest[p]
            elif waits[p] and p in asleep:  # asleep with requests waiting for blocks, it wakes when a decode
                for d in unpulled_to[p]:  # replica's pull has freed some (the transfer's end), then hands off
                    if d != r:  # after an iteration (r's own pulls: r pauses after each, kvstudy/engine/loop.py)
                        bound = min(bound, max(clock[d], links.free_at[p]) + soonest[p])
        pulls = math.inf
        for pullers in unpulled_to:  # decode replicas pulling over the same link as r: their pulls in time order
            if r in pullers:
                for d in pullers:
                    if d != r:
                        pulls = min(pulls, clock[d] if d < r else math.nextafter(clock[d], math.inf))
        engines[r].pull_limit = max(pulls, least)
        return max(bound, least)

    for r in range(size):
        resume(r)  # each pauses first at its clock 0
    waits = [e.state.waiting for e in engines]  # an asleep prefill replica with none waiting wakes to nothing
    links = engines[n_p].handoff.links if size > n_p else None  # the prefill replicas' links (SenderLinks)
    # the least seconds of a prefill replica's iteration (its latency model's bound; 0: none known): a handoff comes
    # at least that long after the decision that starts its iteration
    soonest = [float(getattr(e.latency, "min_iteration_seconds", lambda: 0.0)()) for e in engines[:n_p]]
    states = [e.state.request_state for e in engines]
    for r in range(n_p):
        engines[r].state.hold = set()
    p_refused = [states[r] == REJECTED for r in range(n_p)]
    d_refused = [states[r] == REJECTED for r in range(n_p, size)]
    # a request needs a decode replica that can hold it whole (and, disaggregated, a prefill replica for its prompt)
    d_none = np.logical_and.reduce(d_refused).tolist()
    p_none = np.logical_and.reduce(p_refused).tolist()

    def pick(router, pool: range, refused, k: int, name: str) -> int:
        able = [m for m in pool if not refused[m - pool.start][k]]
        j = _checked(router.route(k, [views[m] for m in able]), k, len(able), name)
        return able[j]

    decode_pool, prefill_pool = range(n_p, size), range(0, n_p)

    def local(k: int, d: int) -> bool:
        """The decider: request k runs whole on decode replica d (chosen, or None: not picked yet)."""
        decider = settings.decider
        if decider == "never" or p_none[k]:
            return True
        if decider == "short_prompt":
            return prompt[k] <= settings.threshold
        if decider == "prefix":
            return prompt[k] - views[d].cached(k) <= settings.threshold
        return False

    def route(k: int) -> None:
        now[0] = arrival[k]
        d = pick(d_router, decode_pool, d_refused, k, names[1]) if settings.decode_first else None
        if local(k, d):
            if d is None:
                d = pick(d_router, decode_pool, d_refused, k, names[1])
            target = d
        else:
            target = pick(p_router, prefill_pool, p_refused, k, names[0])
            split.prefill[k] = target
            if d is not None:
                chosen[k] = d
            if output[k] > 1:
                engines[target].state.hold.add(k)
        split.final[k] = target
        for m in range(size):
            if m != target:
                states[m][k] = ELSEWHERE
        views[target].pending += 1
        if target in asleep:
            asleep.discard(target)
            resume(target, float(arrival[k]))

    def handoff(e: float, i: int, src: int) -> None:
        now[0] = e
        d = chosen.pop(i, None)
        if d is None:
            d = pick(d_router, decode_pool, d_refused, i, names[1])
        split.final[i], split.handed_at[i] = d, e
        engines[d].handoff.source[i] = src
        unpulled_to[src][d] = unpulled_to[src].get(d, 0) + 1
        views[d].pending += 1
        post(d, e, "arrive", i, (e, engines[src].state.first_scheduled[i]))

    k = 0
    try:
        while True:
            while k < n and d_none[k]:
                k += 1
            while alarms and (alarms[0][1] not in asleep or not engines[alarms[0][1]].state.inbox):
                heappop(alarms)  # stale: the replica was woken by a request first
            due_a = arrival[k] if k < n else math.inf
            due_h = hand[0][0] if hand else math.inf
            due = min(due_a, due_h, alarms[0][0]) if alarms else min(due_a, due_h)
            if heap and heap[0][0] < due:  # the earliest replica runs up to its horizon (or the due event)
                t, r = heappop(heap)
                views[r].pending = 0
                if lockstep:  # every replica one step at a time: the same order, slower (a check of the horizons)
                    resume(r, min(due, max(heap[0][0], math.nextafter(t, math.inf))) if heap else due)
                else:
                    resume(r, horizon(r, t, due))
                continue
            if hand and due_h == due:
                e, _, i, src = heappop(hand)
                handoff(e, i, src)
            elif alarms and alarms[0][0] == due:
                when, r = heappop(alarms)
                asleep.discard(r)
                resume(r, when)
            elif k < n:
                route(k)
                k += 1
            elif asleep:  # nothing left to route or hand off, every replica asleep: none will get more work
                for r in sorted(asleep):
                    asleep.discard(r)
                    resume(r, None)
            elif not heap:
                break
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every replica stops where it stands, what is done is kept
        stop_all(loops, results)
    if any(res is None for res in results):  # a bug: every replica's loop ends above
        raise KvStudyError("a replica of the disaggregated cluster never finished its run")
    return results, split


def _less(counts: dict, key: int) -> None:
    """One fewer under ``key`` (the key dropped at 0: the dicts list who still reaches whom)."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


def handoff_columns(requests: pd.DataFrame, order: np.ndarray, split: Split, engines: Sequence, n_p: int,
                    prefill_results) -> pd.DataFrame:
    """requests.parquet's disaggregation columns (``requests`` sorted by request_id; ``order`` the run's indices in
    that order): ``prefill_replica`` (-1: ran whole on a decode replica), ``handoff_time`` (the prefill's end, the
    request's first token; NaN: not handed off), ``decode_admitted`` (its admission on the decode replica, when its KV
    pull started), ``transfer_start`` / ``transfer_end`` (on the prefill replica's link), ``transfer_bytes`` (all
    GPUs'), ``transfer_tokens``, ``decode_wait`` (admission - handoff: waiting for the decode replica's blocks) and
    ``transfer_seconds``; the prefill replica's preemptions are added to the request's counts."""
    n = len(order)
    cols = {c: np.full(n, math.nan) for c in ("decode_admitted", "transfer_start", "transfer_end")}
    nbytes, tokens = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for engine in engines[n_p:]:
        for i, (admitted, start, end, b, tok) in engine.handoff.records.items():
            cols["decode_admitted"][i], cols["transfer_start"][i], cols["transfer_end"][i] = admitted, start, end
            nbytes[i], tokens[i] = b, tok
    out = requests.copy()
    out["prefill_replica"] = split.prefill[order]
    out["handoff_time"] = split.handed_at[order]
    for c, v in cols.items():
        out[c] = v[order]
    out["transfer_bytes"], out["transfer_tokens"] = nbytes[order], tokens[order]
    out["decode_wait"] = out["decode_admitted"] - out["handoff_time"]
    out["transfer_seconds"] = out["transfer_end"] - out["transfer_start"]
    handed = ~np.isnan(split.handed_at[order])
    for r, res in enumerate(prefill_results):  # preemptions of the prefill part, on its prefill replica
        mine = handed & (split.prefill[order] == r)
        if mine.any():
            for c in ("preemptions", "restarts", "preemptions_recompute", "preemptions_swap", "recomputed_tokens",
                      "swap_fallbacks"):
                if c in out:
                    out.loc[mine, c] = out.loc[mine, c].to_numpy() + res.requests[c].to_numpy()[mine]
    return out


def split_summary(requests: pd.DataFrame, iterations: pd.DataFrame, settings: HandoffSettings,
                  pools: Sequence[str]) -> dict:
    """summary.json's ``disaggregation``: the settings, how many requests were handed off or ran whole on a decode
    replica, the transfer's seconds and its share of the time from the first token to the second (the gap the
    handoff lands in), the wait for decode blocks, and per pool its utilisation (busy seconds over the run's span per
    replica), its iterations' mean KV blocks in use and its queue (``mean_waiting``: requests waiting in it, averaged
    over the run's span: the seconds they waited there over the span)."""
    done = requests[requests["state"] == "done"]
    handed = done[done["handoff_time"].notna()]
    span = float(iterations["start"].add(iterations["duration"]).max() - iterations["start"].min()) \
        if len(iterations) else 0.0
    out = {"flow": settings.flow, "decider": settings.decider, "threshold": settings.threshold,
           "load": settings.load, "link": settings.link if settings.gbps is None else f"{settings.gbps} GB/s",
           "handed_off": int(len(handed)), "whole_on_decode": int((done["prefill_replica"] == -1).sum()),
           "prefill_only": int(((done["prefill_replica"] >= 0) & done["handoff_time"].isna()).sum())}
    if len(handed):
        ts = handed["transfer_seconds"].dropna()
        out["transfer_seconds"] = {"median": float(ts.median()) if len(ts) else None,
                                   "p90": float(ts.quantile(0.9)) if len(ts) else None}
        out["transfer_bytes"] = int(handed["transfer_bytes"].sum())
        out["decode_wait_seconds"] = {"median": float(handed["decode_wait"].median()),
                                      "p90": float(handed["decode_wait"].quantile(0.9))}
    # the seconds requests waited in each pool's queues: before their prefill on a prefill replica; before their
    # admission on a decode replica (a handed-off one from its handoff, one run whole there from its arrival)
    whole = done["prefill_replica"] == -1
    before_prefill = done["first_scheduled_time"] - done["arrival_time"]
    waited = (float(before_prefill[~whole].sum()),
              float(handed["decode_wait"].sum()) + float(before_prefill[whole].sum()))
    per_pool = {}
    for (name, replicas), wait in zip(pools, waited):
        it = iterations[iterations["replica"].isin(replicas)]
        busy = float(it["duration"].sum())
        kv = "blocks_used" if "blocks_used" in it else "kv_tokens"
        per_pool[name] = {"replicas": len(replicas), "iterations": int(len(it)),
                          "utilisation": busy / (span * len(replicas)) if span > 0 else None,
                          f"mean_{kv}": float(it[kv].mean()) if len(it) and kv in it else None,
                          # time-averaged requests waiting in the pool (Little's law: waiting seconds over the span)
                          "mean_waiting": wait / span if span > 0 else None}
    out["pools"] = per_pool
    return out


def split_events(request_id, results, split: Split, n_p: int) -> pd.DataFrame:
    """events.parquet of a disaggregated cluster, with a ``replica`` column, in time order: a prefill replica's events
    of the requests it prefilled (but not the ``finish`` of a handed-off one's prefill part: the request finishes on
    its decode replica), a decode replica's of the requests that ended there; up-front rejections once (replica
    0's)."""
    ids = np.asarray(request_id)
    prefill_of = pd.Series(split.prefill, index=ids)
    final_of = pd.Series(split.final, index=ids)
    handed = pd.Series(~np.isnan(split.handed_at), index=ids)
    parts = []
    for r, res in enumerate(results):
        ev = res.events
        rid = ev["request_id"].to_numpy()
        if r < n_p:
            mine = prefill_of.reindex(rid).to_numpy() == r
            mine &= ~((ev["kind"].to_numpy() == "finish") & handed.reindex(rid, fill_value=False).to_numpy())
        else:
            mine = final_of.reindex(rid).to_numpy() == r
        keep = mine | ((final_of.reindex(rid).to_numpy() == -1) & (r == 0)) | (rid < 0)
        parts.append(ev[keep].assign(replica=r))
    return pd.concat(parts, ignore_index=True).sort_values("time", kind="stable").reset_index(drop=True)
