"""Several replicas behind a router (issue 37, kvstudy/cluster/driver.py): one replica through the driver is the
single engine bit for bit; round-robin replicas are independent engines on their share of the requests; load-aware
routers see each replica as it stands at the arrival (worked by hand); same config, same results."""
import json

import numpy as np
import pandas as pd
import pytest

from kvstudy import api
from kvstudy.cluster.driver import drive, merge
from kvstudy.cluster.routers import RoundRobin
from kvstudy.errors import ConfigError, KvStudyError
from kvstudy.workloads.requests import make_requests

FAST = ["latency=linear", "engine.progress=false", "+demand=high", "workload.num_requests=240"]
SETUPS = {  # a policy on each memory model, and prefix caching
    "vllm_paged": ["+policy=vllm", "memory=paged"],
    "mcsf_paper": ["+policy=mcsf"],
    "rr_sjf_paged": ["+policy=rr_sjf", "memory=paged"],
    "sarathi_prefix": ["+policy=sarathi", "workload=shared_prompt", "memory=paged_prefix"],
}


def _engine(cfg, ctx, requests=None, predicted=None, seed_offset=0):
    policy = api.build_policy(cfg)
    before = getattr(policy, "before_run", None)
    inputs = before(ctx) or {} if callable(before) else {}
    policy.reset(ctx.seed + seed_offset)
    req = ctx.requests if requests is None else requests
    pred = ctx.predicted if predicted is None else predicted
    return api.build_engine(cfg, req, pred, policy, ctx.latency, ctx.arch, ctx.hardware, ctx.capacity, **inputs)


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_one_replica_through_the_driver_is_the_engine_bit_for_bit(setup):
    cfg = api.compose(SETUPS[setup] + FAST)
    ctx = api.run_context(cfg)
    alone = _engine(cfg, ctx).run()
    engine = _engine(cfg, ctx)
    results, routed = drive([engine], RoundRobin(), ctx.requests.arrival_time.tolist())
    assert (routed[ctx.requests.prompt_tokens >= 0] >= -1).all()
    pd.testing.assert_frame_equal(results[0].requests, alone.requests)
    pd.testing.assert_frame_equal(results[0].iterations, alone.iterations)
    merged = merge([engine], results, routed, "round_robin")
    pd.testing.assert_frame_equal(merged.requests.drop(columns="replica"), alone.requests)
    assert merged.status == alone.status


def test_cluster_replicas_1_is_the_single_engine_run():
    cfg = api.compose(SETUPS["vllm_paged"] + FAST)
    one, s1 = api.simulate(cfg)
    cfg1 = api.compose(SETUPS["vllm_paged"] + FAST + ["cluster.replicas=1", "router=least_kv"])
    again, s2 = api.simulate(cfg1)
    pd.testing.assert_frame_equal(one.requests, again.requests)
    pd.testing.assert_frame_equal(one.iterations, again.iterations)
    assert "cluster" not in s2 and "replica" not in again.requests


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_round_robin_replicas_are_independent_engines_on_their_share(setup):
    """Round-robin ignores load, so replica k must run exactly as a single engine given requests k, k+N, ...: every
    request's first token and completion, and the replica's iterations, equal."""
    n_rep = 3
    cfg = api.compose(SETUPS[setup] + FAST + [f"cluster.replicas={n_rep}"])
    result, summary = api.simulate(cfg)
    assert summary["cluster"]["replicas"] == n_rep and result.status == "completed"
    ctx = api.run_context(cfg)
    r = ctx.requests
    served = np.flatnonzero(result.requests.sort_values("request_id")["replica"].to_numpy() >= 0)
    for k in range(n_rep):
        mine = served[k::n_rep]
        sub = make_requests(r.arrival_time[mine], r.prompt_tokens[mine], r.output_tokens[mine], source="share",
                            request_id=r.request_id[mine],
                            segments=[r.segments[i] for i in mine] if r.segments is not None else None)
        alone = _engine(cfg, ctx, sub, np.asarray(ctx.predicted)[mine], seed_offset=k).run()
        got = result.requests[result.requests.replica == k].reset_index(drop=True)
        assert list(got.request_id) == list(alone.requests.request_id)
        for col in ("first_token_time", "completion_time", "preemptions"):
            np.testing.assert_array_equal(got[col].to_numpy(), alone.requests[col].to_numpy(), err_msg=col)
        its = result.iterations[result.iterations.replica == k].drop(columns="replica").reset_index(drop=True)
        pd.testing.assert_frame_equal(its, alone.iterations)


def _trace(tmp_path, rows):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_least_outstanding_routes_by_queue_length_at_the_arrival(tmp_path):
    """Two replicas, every iteration 1 s, vLLM runs one request at a time (max_num_seqs=1); each request is a prefill
    and one decode (2 s). Arrivals 0, 0, 0, 0.5, 2.5. A request routed to a replica counts in its queue at once (as
    in Vidur's replica queue): request 0 -> replica 0 (0 vs 0, lowest index), 1 -> 1 (1 vs 0), 2 -> 0 (1 vs 1).
    At 0 replica 0 starts request 0 (request 2 waits), replica 1 request 1; at 0.5 the queues are 1 and 0: request
    3 -> replica 1. At 2 both start their next (2 and 3); at 2.5 both queues are empty: request 4 -> replica 0, which
    runs it after request 2, in [4, 6)."""
    rows = [{"arrival_time": t, "prompt_tokens": 8, "output_tokens": 2} for t in (0.0, 0.0, 0.0, 0.5, 2.5)]
    cfg = api.compose(["workload=trace", f"workload.path={_trace(tmp_path, rows)}", "model=llama32_1b",
                       "hardware=a100_tp1", "memory=paged", "memory.watermark=0", "+policy=vllm",
                       "policy.max_num_seqs=1", "latency=linear", "latency.d0=1.0", "latency.d1=0",
                       "engine.progress=false", "cluster.replicas=2", "router=least_outstanding"])
    result, summary = api.simulate(cfg)
    assert list(result.requests.replica) == [0, 1, 0, 1, 0]
    # replica 0: request 0 in [0, 2) (prefill + 1 decode), request 2 in [2, 4), request 4 in [4, 6)
    assert list(result.requests.completion_time) == [2.0, 2.0, 4.0, 4.0, 6.0]
    assert [r["requests"] for r in summary["cluster"]["per_replica"]] == [3, 2]


def test_least_kv_and_prefix_affinity_read_the_replicas_live(tmp_path):
    """Prefix affinity: request 2 shares request 0's three 16-token blocks; 0 went to replica 0, 1 (unrelated) to
    replica 1, so 2 goes to replica 0 (its cache holds 48 of its tokens: hits stop at prompt - 1) although both are
    equally loaded. least_kv: at 0 nothing holds KV, so 1 joins the replica with fewer outstanding requests (1); at
    1.5 replica 0 holds five blocks (request 0's 64 tokens and its first decode), replica 1 two: 2 goes to 1."""
    rows = [{"arrival_time": 0.0, "prompt_tokens": 64, "output_tokens": 40, "hash_ids": [1, 2, 3, 4]},
            {"arrival_time": 0.0, "prompt_tokens": 16, "output_tokens": 40, "hash_ids": [9]},
            {"arrival_time": 1.5, "prompt_tokens": 64, "output_tokens": 4, "hash_ids": [1, 2, 3, 7]}]
    base = ["workload=trace", f"workload.path={_trace(tmp_path, rows)}", "workload.hash_block_size=16",
            "model=llama32_1b", "hardware=a100_tp1", "memory=paged_prefix", "memory.watermark=0", "+policy=vllm",
            "latency=linear", "latency.d0=1.0", "latency.d1=0", "engine.progress=false", "cluster.replicas=2"]
    affinity, s = api.simulate(api.compose(base + ["router=prefix_affinity"]))
    assert list(affinity.requests.replica) == [0, 1, 0]
    assert affinity.requests.prefix_cached_tokens.tolist() == [0, 0, 48]
    assert s["prefix_hit_rate"] == pytest.approx(48 / 144)
    least_kv, _ = api.simulate(api.compose(base + ["router=least_kv"]))
    assert list(least_kv.requests.replica) == [0, 1, 1]  # replica 1 holds one block, replica 0 four
    assert least_kv.requests.prefix_cached_tokens.tolist() == [0, 0, 0]


def test_same_config_same_results_for_random_routers():
    for router in ("random", "power_of_two"):
        cfg = api.compose(SETUPS["vllm_paged"] + FAST + ["cluster.replicas=4", f"router={router}"])
        a, sa = api.simulate(cfg)
        b, sb = api.simulate(cfg)
        pd.testing.assert_frame_equal(a.requests, b.requests)
        pd.testing.assert_frame_equal(a.iterations, b.iterations)
        assert sa["cluster"] == sb["cluster"]
        c, _ = api.simulate(api.compose(SETUPS["vllm_paged"] + FAST + ["cluster.replicas=4", f"router={router}",
                                                                        "seed=1"]))
        assert not np.array_equal(a.requests.replica.to_numpy(), c.requests.replica.to_numpy()[:len(a.requests)]) \
            or len(a.requests) != len(c.requests)


def test_a_router_naming_no_replica_is_refused():
    class Broken(RoundRobin):
        def route(self, i, replicas):
            return len(replicas)

    cfg = api.compose(SETUPS["vllm_paged"] + FAST)
    ctx = api.run_context(cfg)
    with pytest.raises(KvStudyError, match="sent request 0 to replica 2; replicas are 0 .. 1"):
        drive([_engine(cfg, ctx), _engine(cfg, ctx)], Broken(), ctx.requests.arrival_time.tolist())


def test_bad_cluster_settings_are_named():
    with pytest.raises(ConfigError, match="cluster.replicas"):
        api.simulate(api.compose(SETUPS["vllm_paged"] + FAST + ["cluster.replicas=0"]))
    with pytest.raises(ConfigError, match="router.max_imbalance"):
        api.simulate(api.compose(SETUPS["vllm_paged"] + FAST + ["router=prefix_affinity", "router.max_imbalance=-1"]))
    with pytest.raises(ConfigError, match="authors_code"):
        api.simulate(api.compose(["+policy=mcsf", "regime=authors", "cluster.replicas=2"] + FAST))


def test_records_of_a_cluster_run(tmp_path):
    cfg = api.compose(SETUPS["vllm_paged"] + FAST + ["cluster.replicas=2", "router=least_outstanding",
                                                      "record.events=true"])
    summary = api.run(cfg, tmp_path / "run")
    run = api.load_run(tmp_path / "run")
    req, it = run.requests, run.iterations
    assert set(req.replica) == {0, 1} and set(it.replica) == {0, 1}
    assert (np.diff(it.start.to_numpy()) >= 0).all()  # the cluster's iterations in time order
    per = summary["cluster"]["per_replica"]
    assert sum(p["requests"] for p in per) == len(req) == summary["completed"]
    assert [p["iterations"] for p in per] == [int((it.replica == k).sum()) for k in (0, 1)]
    ev = run.events
    first = ev[ev.kind == "first_token"]
    assert len(first) == len(req)  # each request's events once, from its own replica
    owner = req.set_index("request_id").replica
    assert (first.replica.to_numpy() == owner[first.request_id].to_numpy()).all()


def _tiny(tmp_path, rows, *overrides):
    return api.compose(["workload=trace", f"workload.path={_trace(tmp_path, rows)}", "model=llama32_1b",
                        "hardware=a100_tp1", "memory=paged", "memory.watermark=0", "+policy=vllm", "latency=linear",
                        "latency.d0=1.0", "latency.d1=0", "engine.progress=false", *overrides])


def test_a_replica_that_gets_no_request_does_not_mark_the_run(tmp_path):
    """Three replicas, two requests: replica 2 serves nothing, which is no failure of the run (a single engine with
    nothing served ends nothing_served; a replica of a cluster is judged with the others)."""
    rows = [{"arrival_time": t, "prompt_tokens": 8, "output_tokens": 2} for t in (0.0, 1.0)]
    result, summary = api.simulate(_tiny(tmp_path, rows, "cluster.replicas=3"))
    assert result.status == "completed" and summary["message"] == ""
    assert [r["requests"] for r in summary["cluster"]["per_replica"]] == [1, 1, 0]


def test_an_interrupt_in_one_replica_stops_them_all(tmp_path):
    rows = [{"arrival_time": 0.5 * i, "prompt_tokens": 8, "output_tokens": 4} for i in range(20)]
    cfg = _tiny(tmp_path, rows, "cluster.replicas=2")
    ctx = api.run_context(cfg)
    engines = [_engine(cfg, ctx, seed_offset=k) for k in range(2)]
    step, calls = engines[0].policy.step, []

    def interrupted_at_third(view):  # Ctrl-C (or SIGTERM, turned into it by api.run) inside replica 0's step
        calls.append(view.step)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return step(view)

    engines[0].policy.step = interrupted_at_third
    results, routed = drive(engines, RoundRobin(), ctx.requests.arrival_time.tolist())
    assert [r.status for r in results] == ["interrupted", "interrupted"]
    merged = merge(engines, results, routed, "round_robin")
    assert merged.status == "interrupted" and merged.message.startswith("replica 0: interrupted")
    assert (routed[5:] == -1).all()  # nothing routed after the stop


def test_a_router_sees_a_busy_replica_as_it_is_at_the_arrival(tmp_path):
    """Replica 0 runs request 0 (64-token prompt, 2 tokens) in [0, 2): at 1.5 it still holds its five blocks (its
    loop is paused at 2, the request already finished there); replica 1 holds request 1's two. least_kv must send
    request 2 (at 1.5) to replica 1."""
    rows = [{"arrival_time": 0.0, "prompt_tokens": 64, "output_tokens": 2},
            {"arrival_time": 0.0, "prompt_tokens": 16, "output_tokens": 40},
            {"arrival_time": 1.5, "prompt_tokens": 16, "output_tokens": 4}]
    result, _ = api.simulate(_tiny(tmp_path, rows, "cluster.replicas=2", "router=least_kv"))
    assert list(result.requests.replica) == [0, 1, 1]


def test_a_bad_mul_interpolation_is_named_before_anything_is_written(tmp_path):
    """``${mul:...}`` (kvstudy/__init__.py) scales a load with cluster.replicas; a factor that is no number is named
    by its key in one line, by api.run as by the rest of the checks, and no run folder is written."""
    cfg = api.compose(SETUPS["vllm_paged"] + FAST + ["demand.rate=${mul:abc,2}"])
    with pytest.raises(ConfigError, match=r"demand.rate: cannot be resolved .*multiplies numbers, got 'abc'"):
        api.run(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    cfg = api.compose(SETUPS["vllm_paged"] + FAST + ["cluster.replicas=4", "demand.rate='${mul:${cluster.replicas},2.5}'"])
    assert api.run_context(cfg, latency=False).cfg.demand.rate == 10.0


SHARED_CASES = {  # preemption (small KV), swaps, both memories, prefix caching, CacheOPT, a mixed-GPU pool (each
    # replica refuses other requests up front), an offload pool the replicas share (lockstep)
    "vllm_preempting": ["+policy=vllm", "memory=paged", "memory.capacity_tokens=3000", "router=least_kv"],
    "vllm_swap": ["+policy=vllm", "memory=paged", "memory.capacity_tokens=3000", "policy.preemption_mode=swap"],
    "vllm_rejecting": ["+policy=vllm", "memory=paged", "memory.capacity_tokens=600"],  # 6 routed nowhere
    # the replicas stop early while requests are still to be routed (to them too): their tables hold those rows
    "stopped_early": ["+policy=vllm", "memory=paged", "engine.max_iterations=40"],
    "mcsf_paper": ["+policy=mcsf", "memory.capacity_tokens=3000", "router=power_of_two"],
    "sarathi_prefix": ["+policy=sarathi", "workload=shared_prompt", "memory=paged_prefix", "router=prefix_affinity"],
    "cacheopt": ["+policy=cacheopt", "memory.capacity_tokens=4000"],
    "mixed_pool": ["+policy=vllm", "memory=paged", "memory.capacity_tokens=auto", "memory.gpu_memory_utilization=0.866",
                   "+cluster.pools={main: {role: mixed, hardware: [a100_tp2, a100_tp4]}}"],
    "offload_shared": ["+policy=vllm", "memory=paged_offload", "workload=shared_prompt", "memory.capacity_tokens=6144",
                       "memory.offload.shared=true", "memory.offload.host_gb=0.5"],
}


@pytest.mark.parametrize("case", sorted(SHARED_CASES))
def test_replicas_sharing_their_per_request_lists_equal_replicas_with_their_own(case, monkeypatch):
    """Issue 59 item 5: the replicas ``drive`` steps share one list per per-request field (each writes only its own
    requests' entries) and keep only their own rows; the merged run equals one where every replica has lists and a
    table of its own (the sharing switched off), column for column."""
    from kvstudy.engine.loop import StepEngine

    overrides = SHARED_CASES[case] + FAST + ([] if "pools" in str(SHARED_CASES[case]) else ["cluster.replicas=3"])
    shared, _ = api.simulate(api.compose(overrides))
    monkeypatch.setattr(StepEngine, "shared_lists", property(lambda self: None, lambda self, value: None),
                        raising=False)
    own, _ = api.simulate(api.compose(overrides))
    assert shared.status == own.status
    pd.testing.assert_frame_equal(shared.requests, own.requests)
    pd.testing.assert_frame_equal(shared.iterations, own.iterations)
    assert shared.extra["cluster"] == own.extra["cluster"]
    if case == "vllm_rejecting":
        assert (shared.requests.replica == -1).sum() == 6
    if case == "stopped_early":
        assert shared.status == "max_iterations"
