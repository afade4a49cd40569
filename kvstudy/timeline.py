"""Pictures of one run: each request's life (a Gantt chart, from ``record.events=true``) and memory over time.

    from kvstudy import api, timeline
    run = api.load_run("outputs/my_run")                 # a run with record.events=true
    timeline.gantt(run, requests=range(40))              # waiting, running, swapped out / preempted, per request
    timeline.memory(run)                                 # KV in use (and blocks, on paged memory) per iteration
"""
from __future__ import annotations

from typing import Iterable, Optional

import pandas as pd

#: a request's states between its events, and their colours; ``handed off``: prefilled on a prefill replica, waiting
#: on its decode replica for blocks (disaggregation, docs/disaggregation.md; its KV pull is drawn apart, in black)
COLOURS = {"waiting": "#d9d9d9", "running": "#2b8cbe", "swapped": "#fdae6b", "preempted": "#e34a33",
           "handed off": "#9e9ac8"}
_NEXT = {"admit": "running", "swap_in": "running", "first_token": None, "finish": None, "reject": None,
         "clear": None, "handed_in": "handed off"}


def lives(events: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Each request's time split into segments: ``waiting`` (arrived, not yet admitted), ``running`` (from an
    admission or swap-in), ``swapped`` (its KV in host memory), ``preempted`` (recomputed: waiting to start
    again) and ``handed off`` (a disaggregated run's: from the prefill's end until its decode replica admits it). Columns ``request_id, state, start, end``; a request still unfinished at the run's end has an open
    last segment ending at its last event."""
    rows = []
    arrival = requests.set_index("request_id").arrival_time
    for rid, ev in events[events.request_id >= 0].groupby("request_id", sort=True):
        state, since = "waiting", float(arrival.get(rid, ev.time.iloc[0]))
        for t, kind, mode in zip(ev.time.to_numpy(), ev.kind.astype(str), ev["mode"].astype(str)):
            if kind in ("preempt", "evict"):
                new = "swapped" if mode == "swap" else "preempted"
            elif kind in ("finish", "reject"):
                new = "done"
            else:
                new = _NEXT.get(kind) or state
            if new != state:
                if t > since or state not in ("waiting", "handed off"):  # (admitted at once: no wait to draw)
                    rows.append((rid, state, since, float(t)))
                state, since = new, float(t)
        if state != "done" and len(ev):
            rows.append((rid, state, since, float(ev.time.iloc[-1])))
    return pd.DataFrame(rows, columns=["request_id", "state", "start", "end"])


def gantt(run, requests: Optional[Iterable[int]] = None, ax=None, limit: int = 60):
    """A Gantt chart of requests' lives (``lives``) for a run with ``record.events=true`` (an ``api.Run`` or
    anything with ``events`` and ``requests`` tables): one row per request, ``requests`` (ids) or the first
    ``limit`` by arrival. Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events, reqs = run.events, run.requests
    ids = list(requests) if requests is not None else reqs.sort_values("arrival_time").request_id[:limit].tolist()
    seg = lives(events[events.request_id.isin(ids)], reqs)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, max(2.0, 0.18 * len(ids))), layout="constrained")  # savefig keeps labels
    row = {rid: k for k, rid in enumerate(ids)}
    for state, part in seg.groupby("state"):
        for rid, s, e in zip(part.request_id, part.start, part.end):
            ax.barh(row[rid], e - s, left=s, height=0.8, color=COLOURS[state], linewidth=0)
    handles = [Patch(color=c, label=s) for s, c in COLOURS.items()]
    if "transfer_start" in reqs:  # disaggregation: each handed-off request's KV pull, on its row
        moved = reqs[reqs.request_id.isin(ids) & reqs.transfer_start.notna()]
        for rid, s, e in zip(moved.request_id, moved.transfer_start, moved.transfer_end):
            ax.barh(row[rid], max(e - s, 0.0), left=s, height=0.3, color="black", linewidth=0)
        handles.append(Patch(color="black", label="KV pull"))
    ax.set_yticks(range(len(ids)), [str(i) for i in ids], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_ylabel("request")
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    return ax


def memory(run, ax=None):
    """KV tokens in use per iteration against the capacity (and blocks used on paged memory), over time."""
    import matplotlib.pyplot as plt

    it = run.iterations
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3), layout="constrained")
    twin = None
    ax.step(it.start, it.kv_tokens_in_use, where="post", label="KV tokens in use", lw=0.8)
    ax.axhline(float(it.capacity.max()) if len(it) else 0.0, color="k", ls="--", lw=0.8, label="capacity (tokens)")
    if "blocks_used" in it and len(it):
        bs = float(it.kv_tokens_in_use.max()) / max(1, int(it.blocks_used.max()))  # only for the second axis' scale
        twin = ax.twinx()
        twin.step(it.start, it.blocks_used, where="post", color="#e34a33", lw=0.6, label="blocks used")
        twin.set_ylabel("blocks")
        twin.set_ylim(0, ax.get_ylim()[1] / bs if bs > 0 else None)
    over = it[it.overflow] if "overflow" in it else it.iloc[:0]
    if len(over):
        ax.plot(over.start, over.kv_tokens_in_use, "rx", ms=4, label="clearing event")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("tokens")
    # one legend for both axes (the blocks line is on the second), above the plot, so it covers no line
    handles, labels = ax.get_legend_handles_labels()
    if twin is not None:
        more = twin.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.01), ncol=len(labels),
              frameon=False, borderaxespad=0)
    return ax
