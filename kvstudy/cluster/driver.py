"""Several replicas on one clock (issue 37): each replica is a :class:`~kvstudy.engine.loop.StepEngine` of its own
(its memory, its policy instance, its queue), paused before its first decision at or past the next arrival
(``StepEngine.loop``); a router sends each request, when it arrives, to one replica.

How the clock is shared (Vidur's event order, ``vidur/events/``: an arrival is routed at its arrival time, into the
replica's queue, and the replica takes it at its next scheduling point):

* the driver always does the earliest thing next: route the next arrival if it comes no later than every replica's
  next decision (ties: the arrival first, so a replica deciding at that instant sees it), else let the replicas
  deciding before it run up to it (replicas do not interact between arrivals, so each runs its iterations up to
  the arrival in one go: a pause per arrival, not per iteration);
* a router reads each replica as it stands at the arrival (:class:`ReplicaView`): a replica in the middle of an
  iteration shows the state after that iteration's decision; requests routed to it since count as waiting, as they
  are in Vidur's replica queue (``num_pending_requests``);
* an idle replica sleeps until a request is routed to it; when every request is routed, sleeping replicas are told
  that none will come and finish.

A request no replica's memory can serve (rejected up front by each) is routed nowhere (``replica`` -1); in a pool
of mixed hardware (kvstudy/cluster/pools.py) a request some replicas refuse is routed among the others. With one
replica nothing here runs: ``cluster.replicas=1`` is the single engine, bit for bit.
"""
from __future__ import annotations

import math
from heapq import heappop, heappush
from typing import List, Sequence

import numpy as np
import pandas as pd

from kvstudy.engine import records
from kvstudy.errors import KvStudyError
from kvstudy.engine.states import ELSEWHERE, REJECTED, EngineResult
from kvstudy.engine.loop import IDLE


class ReplicaView:
    """What a router sees of one replica at the arrival being routed (kvstudy/cluster/routers.py ``ReplicaLoad``'s
    fields). A replica in the middle of an iteration is paused at that iteration's end with its completions already
    applied; until that end the router sees the load the iteration started with (``engine.state.inflight``)."""

    __slots__ = ("engine", "pending", "now")

    def __init__(self, engine, now: list) -> None:
        self.engine = engine
        self.pending = 0  # requests routed to it that its loop has not taken into its queue yet
        self.now = now  # [the arrival time being routed], shared by the driver's views

    @property
    def waiting(self) -> int:  # changes only at decisions: never ahead of the arrival
        return len(self.engine.state.waiting) + self.pending

    def _flight(self):
        """(end, outstanding, KV) of the iteration in flight at the arrival, if it finishes requests; else None."""
        flight = self.engine.state.inflight
        return flight if flight is not None and self.now[0] < flight[0] else None

    @property
    def outstanding(self) -> int:
        e, flight = self.engine, self._flight()
        if flight is not None:
            return flight[1] + self.pending
        return e.state.outstanding() + self.pending

    @property
    def kv_blocks(self) -> int:
        """KV in use: blocks on paged memory, tokens (decode contexts + one each) on the paper's memory."""
        e, flight = self.engine, self._flight()
        if flight is not None:
            return flight[2]
        return e.memory.used if e.memory.tracks_blocks else e.state.decode_context_tokens + len(e.state.running)

    @property
    def num_blocks(self) -> int:
        m = self.engine.memory
        return m.num_blocks if m.tracks_blocks else m.capacity_tokens

    def cached(self, i: int) -> int:
        """Tokens of request i's prompt a prefill starting here now would take from the prefix cache."""
        e = self.engine
        if not e.memory.prefix_caching:
            return 0
        return e.memory.cached_tokens(i, e.state.prompt[i])


def drive(engines: Sequence, router, arrival: Sequence[float], lockstep: bool = False):
    """Step ``engines`` on one clock, routing request i (arrival order) when it arrives; returns each engine's
    result and each request's replica (-1: rejected everywhere, never routed). Replicas that share nothing run to the
    next arrival one after another; ``lockstep`` (they share state between arrivals: a KV pool) runs the replica whose
    clock is earliest until it passes the next one's, so everything they share happens in time order. The replicas
    share their per-request lists while they run (RunState ``shared``: each writes only its own requests')."""
    shared: dict = {}
    for e in engines:
        e.shared_lists = shared
    try:
        return _drive(engines, router, arrival, lockstep)
    finally:
        for e in engines:  # a later run of one of them is its own again
            e.shared_lists = None


def _drive(engines: Sequence, router, arrival: Sequence[float], lockstep: bool):
    n, size = len(arrival), len(engines)
    loops = [e.loop() for e in engines]
    results: List[EngineResult] = [None] * size
    now = [0.0]
    views = [ReplicaView(e, now) for e in engines]
    routed = np.full(n, -1, dtype=np.int64)
    heap: list = []  # (clock of its next decision, replica) of every replica with something to do
    asleep: set = set()  # replicas waiting for a request to be routed to them

    def resume(r: int, value=None) -> None:
        try:
            t = loops[r].send(value)
        except StopIteration as stop:
            results[r] = stop.value
            if stop.value.status == "interrupted":  # Ctrl-C / SIGTERM landed in this replica: stop them all
                raise KeyboardInterrupt from None
            return
        if t == IDLE:
            asleep.add(r)
        else:
            heappush(heap, (t, r))

    for r in range(size):
        resume(r)  # each pauses first at its clock 0, before anything arrives
    states = [e.state.request_state for e in engines]
    refused = [s == REJECTED for s in states]  # each replica's up-front rejections (its own hardware's capacity)
    rejected = np.logical_and.reduce(refused).tolist()  # routed nowhere: no replica can serve it
    # replicas of different hardware (a mixed-GPU pool) may refuse different requests: such a request is routed among
    # the replicas that can serve it (the router sees just those)
    uneven = any((r != refused[0]).any() for r in refused[1:])
    others = [[m for m in range(size) if m != j] for j in range(size)]
    route, name = router.route, getattr(router, "name", type(router).__name__)
    k = 0
    try:
        while True:
            while k < n and rejected[k]:
                k += 1
            due = arrival[k] if k < n else math.inf
            while heap and heap[0][0] < due:  # every decision before the next arrival: no routing in between
                t, r = heappop(heap)
                views[r].pending = 0  # its loop now takes every request routed to it (all arrived by its clock)
                if lockstep and heap:  # up to the next replica's clock (at least one iteration: ties go by index)
                    resume(r, min(due, max(heap[0][0], math.nextafter(t, math.inf))))
                else:
                    resume(r, due)
            if k < n:
                now[0] = arrival[k]
                able = [m for m in range(size) if not refused[m][k]] if uneven else None
                if able is not None and len(able) < size:
                    j = _checked(route(k, [views[m] for m in able]), k, len(able), name)
                    j = able[j]
                else:
                    j = _checked(route(k, views), k, size, name)
                routed[k] = j
                for m in others[j]:
                    states[m][k] = ELSEWHERE
                views[j].pending += 1
                if j in asleep:
                    asleep.discard(j)
                    resume(j, float(arrival[k]))
                k += 1
            elif asleep:  # nothing left to route: the sleeping replicas will get no request
                for r in sorted(asleep):
                    asleep.discard(r)
                    resume(r, None)
            elif not heap:
                break
    except KeyboardInterrupt:
        stop_all(loops, results)
    return results, routed


def stop_all(loops, results: list) -> None:
    """Ctrl-C or SIGTERM: every replica's loop stops where it stands and what is done is kept (``results``, filled
    in); re-raised when a replica was building its records when the signal came (nothing to keep)."""
    for r, loop in enumerate(loops):
        if results[r] is None:
            try:
                loop.throw(KeyboardInterrupt)
            except StopIteration as stop:
                results[r] = stop.value
            except KeyboardInterrupt:
                pass
    if any(res is None for res in results):
        raise KeyboardInterrupt


def _checked(j, k: int, size: int, name: str) -> int:
    """A router's answer for request k among ``size`` replicas, as an int; else one line naming the router."""
    if isinstance(j, (bool, np.bool_)) or not isinstance(j, (int, np.integer)) or not 0 <= j < size:
        raise KvStudyError(f"router '{name}' sent request {k} to replica {j!r}; replicas are 0 .. {size - 1}")
    return int(j)


def merge(engines: Sequence, results: Sequence[EngineResult], routed: np.ndarray, router_name: str,
          hardware: Sequence[str] = None) -> EngineResult:
    """One run's records from its replicas': each request's row from the replica it was routed to (a ``replica``
    column; -1 for requests rejected up front), the iterations of all replicas (a ``replica`` column, in time order),
    the cluster's status (an interrupted replica's, else the first that did not complete; ``nothing_served`` over
    all requests), and per-replica facts in ``extra['cluster']`` (with ``hardware``, each replica's hardware name:
    cluster.pools)."""
    first = results[0]
    order = np.argsort(engines[0].requests.request_id, kind="stable")  # the requests tables are sorted by request_id
    where = routed[order]
    n, tables = len(where), [res.requests for res in results]
    # the rows (in request_id order) each table holds: every row, or (a replica ``drive`` stepped: records.own_rows)
    # those not routed elsewhere when its run ended
    rows = [np.arange(n) if res.rows is None else res.rows for res in results]
    owned = [where[rows[r]] == r for r in range(len(tables))]  # per table, its rows routed to it
    columns = {}
    for col in tables[0].columns:  # replica 0's rows, each other replica's requests taken from its own
        first_rows = tables[0][col].to_numpy()
        values = np.empty(n, dtype=first_rows.dtype)
        values[rows[0]] = first_rows
        for r in range(1, len(tables)):
            values[rows[r][owned[r]]] = tables[r][col].to_numpy()[owned[r]]
        columns[col] = values
    requests = pd.DataFrame(columns)
    requests["replica"] = where
    iterations = pd.concat([res.iterations.assign(replica=r) for r, res in enumerate(results)], ignore_index=True)
    iterations = iterations.sort_values("start", kind="stable").reset_index(drop=True)
    stopped = [(r, res) for r, res in enumerate(results) if res.status != "completed"]
    rejected = int((requests["state"] == "rejected").sum())
    if stopped:  # an interruption first: it is what makes a resumed sweep run this folder again
        status = next((res.status for _, res in stopped if res.status == "interrupted"), stopped[0][1].status)
        message = "; ".join(f"replica {r}: {res.status}: {res.message}" for r, res in stopped)
    elif len(requests) and not (requests["state"] == "done").any():
        status = "nothing_served"
        message = f"no request was served: all {len(requests)} were rejected (see reject_reason)"
    else:
        status, message = "completed", (f"{rejected} request(s) rejected (see reject_reason)" if rejected else "")
    result = EngineResult(requests, iterations, status, message, sum(res.clearing_events for res in results),
                          first.capacity)
    extra = dict(first.extra)
    if "policy_seconds" in extra:  # paged memory: the pooled time between tokens, over every replica's requests
        extra["tbt_pooled"] = records.pooled_tbt_of(engines)
        seconds = sum(res.extra.get("policy_seconds", 0.0) for res in results)
        extra["policy_seconds"] = round(seconds, 4)
        extra["policy_us_per_iteration"] = round(1e6 * seconds / max(1, len(iterations)), 2)
    if "prefix_cache" in extra:
        extra["prefix_cache"] = records.prefix_summary(requests, iterations)
    if "offload" in extra:  # the replicas' tiers (or their shared pool), over every request
        extra["offload"] = engines[0].memory.connector.merged_summary([res.extra["offload"] for res in results],
                                          int(requests["offload_loaded_tokens"].sum()))
    if "cacheopt" in extra:  # CacheOPT's counters, over every replica's policy
        parts = [res.extra["cacheopt"] for res in results]
        causes = {}
        for p in parts:
            for cause, count in p.get("preemptions_by_cause", {}).items():
                causes[cause] = causes.get(cause, 0) + count
        extra["cacheopt"] = {**parts[0], "stalls": sum(p["stalls"] for p in parts),
                             "embedded": sum(p["embedded"] for p in parts), "preemptions_by_cause": causes}
    extra["cluster"] = {"replicas": len(results), "router": router_name,
                        "per_replica": [_replica_summary(r, res, owned[r]) for r, res in enumerate(results)]}
    if hardware is not None:  # cluster.pools: each replica's hardware and KV capacity (a mixed-GPU pool's differ)
        for r, part in enumerate(extra["cluster"]["per_replica"]):
            part["hardware"], part["kv_capacity_tokens"] = hardware[r], int(results[r].capacity)
    result.extra = extra
    if any(res.events is not None for res in results):
        result.events = _owned_events(engines[0].requests.request_id, results, routed)
        result.batches = pd.concat([res.batches.assign(replica=r) for r, res in enumerate(results)],
                                   ignore_index=True)
    return result


def _owned_events(request_id, results, routed: np.ndarray) -> pd.DataFrame:
    """events.parquet of the cluster: each replica's events of its own requests (every replica logs the up-front
    rejections: replica 0's are kept), with a ``replica`` column, in time order."""
    owner = pd.Series(routed, index=np.asarray(request_id))
    parts = []
    for r, res in enumerate(results):
        ev = res.events
        mine = owner.reindex(ev["request_id"].to_numpy()).to_numpy()
        keep = (mine == r) | ((mine == -1) & (r == 0)) | (ev["request_id"].to_numpy() < 0)
        parts.append(ev[keep].assign(replica=r))
    return pd.concat(parts, ignore_index=True).sort_values("time", kind="stable").reset_index(drop=True)


def _replica_summary(r: int, res: EngineResult, owned: np.ndarray) -> dict:
    """One replica's facts: its requests (``owned``: which rows of its table), completions, iterations, busy time,
    latency medians, preemptions."""
    req = res.requests[owned]
    done = req[req["state"] == "done"]
    it = res.iterations
    out = {"replica": r, "status": res.status, "requests": int(len(req)), "completed": int(len(done)),
           "iterations": int(len(it)), "busy_seconds": float(it["duration"].sum()) if len(it) else 0.0,
           "median_e2e": float(done["e2e_latency"].median()) if len(done) else None,
           "median_ttft": float(done["ttft"].median()) if len(done) else None,
           "preemptions": int(req["preemptions"].sum())}
    if "prefix_cached_tokens" in req:
        out["prefix_hit_rate"] = records.prefix_summary(req, it)["hit_rate"]
    return out

