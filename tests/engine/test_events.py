"""record.events=true (kvstudy/engine/events.py): the events and batches reconcile with requests.parquet and
iterations.parquet, for every kind of run (paper memory with clearing events, paged with recompute, swap and
swap fallbacks, chunked prefill); off, nothing is recorded."""
import numpy as np
import pytest

from kvstudy import api

SMALL = ["+demand=high", "latency=linear", "workload.num_requests=400", "memory.capacity_tokens=6000",
         "engine.progress=false"]
CASES = {
    "alpha_greedy clears (paper memory)": ["+policy=alpha_greedy", "policy.alpha=0"],
    "mcsf (paper memory)": ["+policy=mcsf"],
    "mcsf under latency=unit": ["+policy=mcsf", "latency=unit"],
    "alpha_greedy on paged memory": ["+policy=alpha_greedy", "policy.alpha=0", "memory=paged"],
    "vllm recompute": ["+policy=vllm"],
    "vllm swap with fallbacks": ["+policy=vllm", "policy.preemption_mode=swap", "memory.swap_space_gb=0.02"],
    "sarathi chunked prefill": ["+policy=sarathi"],
    "rr_sjf": ["+policy=rr_sjf"],
}


def _run(overrides):
    result, summary = api.simulate(api.compose(SMALL + overrides + ["record.events=true"]))
    return result, summary


@pytest.mark.parametrize("name", sorted(CASES))
def test_events_reconcile_with_the_tables(name):
    result, summary = _run(CASES[name])
    ev, b, req, it = result.events, result.batches, result.requests, result.iterations
    counts = ev.groupby(["request_id", "kind"], observed=False).size().unstack(fill_value=0)
    counts = counts.reindex(req.request_id, fill_value=0)
    # preemptions per request: preempt + evict events
    assert (counts["preempt"] + counts["evict"]).to_numpy().tolist() == req.preemptions.tolist()
    assert int(counts["finish"].sum()) == summary["completed"]
    assert int((ev.kind == "reject").sum()) == int((req.state == "rejected").sum())
    assert int((ev.kind == "clear").sum()) == summary["clearing_events"]
    first = ev[ev.kind == "first_token"].groupby("request_id").time.min().reindex(req.request_id)
    np.testing.assert_array_equal(first.to_numpy(), req.first_token_time.to_numpy())
    done = ev[ev.kind == "finish"].set_index("request_id").time.reindex(req.request_id)
    np.testing.assert_array_equal(done.to_numpy(), req.completion_time.to_numpy())
    # admissions: one per life (first start and each recompute that came back)
    assert (counts["admit"] >= (req.state == "done").astype(int)).all()
    assert (np.diff(ev.time.to_numpy()) >= -1e-9).all() or name.endswith("unit")  # in order (unit: round stamps)
    assert ev.iteration.between(-1, len(it)).all()  # a row of iterations.parquet, or the next one (docstring)
    # batches: each iteration's rows add up to its columns
    rows = np.arange(len(it))
    assert b.iteration.between(0, len(it) - 1).all()
    size = b.groupby("iteration").size().reindex(rows, fill_value=0).to_numpy()
    pre = b[b.phase == "prefill"].groupby("iteration").tokens.sum().reindex(rows, fill_value=0).to_numpy()
    dec = b[b.phase == "decode"].groupby("iteration").size().reindex(rows, fill_value=0).to_numpy()
    kept = ~it.overflow.to_numpy()
    assert size[kept].tolist() == it.batch_size.to_numpy()[kept].tolist()
    assert pre.tolist() == it.prefill_tokens.tolist()
    assert dec.tolist() == it.decode_tokens.tolist()
    if "preemptions_swap" in req:
        assert int((ev["mode"] == "swap").sum()) == int(req.preemptions_swap.sum())
        assert int((ev["mode"] == "recompute_fallback").sum()) == int(req.swap_fallbacks.sum())
        assert int((ev.kind == "swap_in").sum()) <= int(req.preemptions_swap.sum())


def test_the_cases_exercise_what_they_name():
    """The reconciliation above is only as good as its cases: clearing, swaps, fallbacks and chunks happen."""
    _, s = _run(CASES["alpha_greedy clears (paper memory)"])
    assert s["clearing_events"] > 0
    _, s = _run(CASES["vllm swap with fallbacks"])
    assert s["preemptions_swap"] > 0 and s["swap_fallbacks"] > 0
    res, _ = _run(CASES["sarathi chunked prefill"])
    assert (res.iterations.chunk_tokens > 0).any()


def test_events_off_by_default_change_nothing(tmp_path):
    """Off (the default) no table is recorded or written, and the run's tables are the same as with it on."""
    cfg = api.compose(SMALL + ["+policy=vllm"])
    off, _ = api.simulate(cfg)
    assert off.events is None and off.batches is None
    on, _ = _run(["+policy=vllm"])
    assert off.requests.equals(on.requests) and off.iterations.equals(on.iterations)
    api.run(cfg, tmp_path / "off")
    assert not (tmp_path / "off" / "events.parquet").exists()
    with pytest.raises(Exception, match="record.events=true"):
        api.load_run(tmp_path / "off").events


def test_events_are_written_and_loaded(tmp_path):
    cfg = api.compose(SMALL + ["+policy=rr_sjf", "record.events=true"])
    api.run(cfg, tmp_path / "on")
    run = api.load_run(tmp_path / "on")
    assert set(run.events.kind.unique()) >= {"admit", "first_token", "finish", "preempt"}
    assert len(run.batches) == int(run.iterations.batch_size.sum())


def test_lives_and_pictures(tmp_path):
    """A request's segments cover arrival to completion without gaps; the pictures draw."""
    import matplotlib
    matplotlib.use("Agg")
    from kvstudy import timeline

    cfg = api.compose(SMALL + ["+policy=vllm", "policy.preemption_mode=swap", "memory.swap_space_gb=0.02",
                               "record.events=true"])
    api.run(cfg, tmp_path / "r")
    run = api.load_run(tmp_path / "r")
    seg = timeline.lives(run.events, run.requests)
    req = run.requests.set_index("request_id")
    assert {"waiting", "running", "swapped", "preempted"} <= set(seg.state)
    for rid, part in seg.groupby("request_id"):
        r = req.loc[rid]
        if r.state != "done":
            continue
        assert part.start.iloc[0] == pytest.approx(r.arrival_time) and part.end.iloc[-1] == r.completion_time
        assert (part.start.to_numpy()[1:] == part.end.to_numpy()[:-1]).all()  # contiguous
    assert timeline.gantt(run, limit=30) is not None
    assert timeline.memory(run) is not None
    # saved as a user saves them (savefig, no bbox_inches): every axis label inside the picture (issue 46)
    for ax in (timeline.gantt(run, requests=run.requests.request_id[:3]), timeline.memory(run)):
        fig = ax.figure
        fig.savefig(tmp_path / "picture.png")
        box = fig.bbox
        for label in (ax.xaxis.label, ax.yaxis.label):
            extent = label.get_window_extent()
            assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1
