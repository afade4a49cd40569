"""Prefill/decode disaggregation (issue 57; kvstudy/cluster/disaggregated.py, kvstudy/cluster/handoff.py): hand-worked
handoffs on the linear latency model (a transfer time computed by hand, a decode replica without room, two transfers
on one link, each decider), a zero-cost transfer equal to a co-located run, a known cost shifting results by exactly
it, invariants over random instances on every policy, and bad settings in one line."""
import numpy as np
import pandas as pd
import pytest

from kvstudy import api
from kvstudy.errors import ConfigError
from tests.conftest import needs_shared

D0, D1 = 0.02, 0.001  # the linear latency model: an iteration takes D0 + D1 x (its prefill tokens + its decodes)
LIN = ["latency=linear", f"latency.d0={D0}", f"latency.d1={D1}", "engine.progress=false", "memory=paged"]
SPLIT = "+cluster.pools={p: {role: prefill, replicas: 1}, d: {role: decode, replicas: 1}}"
#: Llama2-70B's KV per token: 2 (K, V) x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 bytes; on each of the
#: prefill replica's two A100s (TP=2) half of it
KV_TOKEN, KV_SHARD = 327_680, 163_840


def _trace(tmp_path, rows):
    path = tmp_path / "t.csv"
    pd.DataFrame(rows, columns=["arrival_time", "prompt_tokens", "output_tokens"]).to_csv(path, index=False)
    return ["workload=trace", f"workload.path={path}"]


def _run(*overrides):
    return api.simulate(api.compose(list(overrides)))[0]


def test_one_request_hand_worked(tmp_path):
    """Prompt 100, output 5, at t=0, a link of 10 GB/s. Prefill replica: one iteration of D0 + 100 D1 = 0.12 s, token
    1 at 0.12 (TTFT). The decode replica admits it at 0.12: the pull moves 100 x 163,840 bytes per GPU in 1.6384 ms,
    the iteration waits for it and computes one token (D0 + D1): token 2 at 0.1426384; three decodes of 0.021 s:
    done at 0.2056384."""
    res = _run("+policy=vllm", *LIN, *_trace(tmp_path, [(0.0, 100, 5)]), SPLIT, "+cluster.handoff={gbps: 10}")
    row = res.requests.iloc[0]
    transfer = 100 * KV_SHARD / 10e9
    assert row["state"] == "done" and row["prefill_replica"] == 0 and row["replica"] == 1
    assert row["first_token_time"] == pytest.approx(0.12, abs=1e-12)
    assert row["handoff_time"] == row["first_token_time"] == row["decode_admitted"] == row["transfer_start"]
    assert row["transfer_seconds"] == pytest.approx(transfer, abs=1e-12) == pytest.approx(0.0016384)
    assert row["transfer_bytes"] == 100 * KV_TOKEN and row["transfer_tokens"] == 100
    assert row["completion_time"] == pytest.approx(0.12 + transfer + 4 * (D0 + D1), abs=1e-12)
    it = res.iterations
    assert list(it["replica"]) == [0, 1, 1, 1, 1]
    assert it["duration"].iloc[1] == pytest.approx(transfer + D0 + D1, abs=1e-12)  # the pull's wait is in it
    assert res.extra["disaggregation"]["handed_off"] == 1


def test_layerwise_load_overlaps_the_pull_with_compute(tmp_path):
    """load=layerwise: the admitting iteration takes max(compute, transfer) + min(...) / layers (80 layers)."""
    res = _run("+policy=vllm", *LIN, *_trace(tmp_path, [(0.0, 100, 5)]), SPLIT,
               "+cluster.handoff={gbps: 10, load: layerwise}")
    transfer, compute = 100 * KV_SHARD / 10e9, D0 + D1
    assert res.iterations["duration"].iloc[1] == pytest.approx(compute + transfer / 80, abs=1e-12)


def test_two_transfers_on_one_link_wait_for_each_other(tmp_path):
    """Two requests prefilled in one iteration (prompts 100 and 300: 0.02 + 0.4 s), admitted together by the decode
    replica at 0.42: the link carries the first pull (1.6384 ms), then the second (4.9152 ms); the iteration waits
    for both."""
    res = _run("+policy=vllm", *LIN, *_trace(tmp_path, [(0.0, 100, 3), (0.0, 300, 3)]), SPLIT,
               "+cluster.handoff={gbps: 10}")
    a, b = res.requests.iloc[0], res.requests.iloc[1]
    t1, t2 = 100 * KV_SHARD / 10e9, 300 * KV_SHARD / 10e9
    assert a["handoff_time"] == b["handoff_time"] == pytest.approx(0.42, abs=1e-12)
    assert a["transfer_start"] == pytest.approx(0.42, abs=1e-12)
    assert b["transfer_start"] == pytest.approx(a["transfer_end"], abs=1e-12)
    assert b["transfer_end"] == pytest.approx(0.42 + t1 + t2, abs=1e-12)
    assert res.iterations["duration"].iloc[1] == pytest.approx(t1 + t2 + D0 + 2 * D1, abs=1e-12)


def test_a_decode_replica_without_room_makes_the_request_wait_then_admits_it(tmp_path):
    """The decode replica holds 160 tokens (10 blocks of 16): request 0 (prompt 100, 20 tokens) holds 8 blocks, so
    request 1 (prompt 100) waits in its queue until request 0 finishes; the prefill replica keeps request 1's blocks
    until then (it is admitted, and pulled, after request 0's completion)."""
    res = _run("+policy=vllm", *LIN, *_trace(tmp_path, [(0.0, 100, 20), (0.001, 100, 3)]),
               "+cluster.pools={p: {role: prefill, replicas: 1}, "
               "d: {role: decode, replicas: 1, memory: {capacity_tokens: 160, watermark: 0.0}}}",
               "+cluster.handoff={link: free}")
    a, b = res.requests.iloc[0], res.requests.iloc[1]
    assert (res.requests["state"] == "done").all()
    assert b["handoff_time"] < a["completion_time"]
    assert b["decode_admitted"] == pytest.approx(a["completion_time"], abs=1e-12)
    assert b["decode_wait"] == pytest.approx(a["completion_time"] - b["handoff_time"], abs=1e-12)
    # each pool's queue over the run's span: request 1 waited on the prefill replica behind request 0's prefill (0.001
    # to 0.12), then on the decode replica for its blocks
    it = res.iterations
    span = (it["start"] + it["duration"]).max() - it["start"].min()
    pools = res.extra["disaggregation"]["pools"]
    assert pools["p"]["mean_waiting"] * span == pytest.approx(0.12 - 0.001, abs=1e-12)
    assert pools["d"]["mean_waiting"] * span == pytest.approx(b["decode_wait"], abs=1e-12)


def _one_at_a_time(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return [(50.0 * k, int(rng.integers(1, 600)), int(rng.integers(1, 60))) for k in range(n)]


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "mcsf", "rr_sjf"])
def test_a_zero_cost_transfer_equals_a_co_located_run(tmp_path, policy):
    """Requests one at a time, the same hardware in both pools, link=free: every request's first token and completion
    equal a single co-located replica's (the decode replica's first iteration computes token 1's KV as a decode
    would: one token at D1)."""
    rows = _one_at_a_time()
    trace = _trace(tmp_path, rows)
    alone = _run(f"+policy={policy}", *LIN, *trace).requests
    split = _run(f"+policy={policy}", *LIN, *trace, SPLIT, "+cluster.handoff={link: free}").requests
    for col in ("first_token_time", "completion_time"):
        np.testing.assert_array_equal(split[col].to_numpy(), alone[col].to_numpy())
    assert (split.loc[split["output_tokens"] > 1, "prefill_replica"] == 0).all()


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_a_transfer_of_known_cost_shifts_completions_by_exactly_it(tmp_path, policy):
    rows = _one_at_a_time()
    trace = _trace(tmp_path, rows)
    free = _run(f"+policy={policy}", *LIN, *trace, SPLIT, "+cluster.handoff={link: free}").requests
    paid = _run(f"+policy={policy}", *LIN, *trace, SPLIT, "+cluster.handoff={gbps: 5}").requests
    cost = np.where(free["output_tokens"] > 1, free["prompt_tokens"] * KV_SHARD / 5e9, 0.0)
    np.testing.assert_array_equal(paid["first_token_time"].to_numpy(), free["first_token_time"].to_numpy())
    np.testing.assert_allclose(paid["completion_time"] - free["completion_time"], cost, rtol=0, atol=1e-9)
    np.testing.assert_allclose(paid["transfer_seconds"].fillna(0.0), cost, rtol=0, atol=1e-12)


def test_the_deciders(tmp_path):
    """never: every request whole on the decode replica (= a single engine); short_prompt: prompts of at most the
    threshold whole there, the others handed off; prefix with threshold above every prompt: all whole."""
    rows = _one_at_a_time(20, seed=3)
    trace = _trace(tmp_path, rows)
    alone = _run("+policy=vllm", *LIN, *trace).requests
    never = _run("+policy=vllm", *LIN, *trace, SPLIT, "+cluster.handoff={decider: never}").requests
    assert (never["prefill_replica"] == -1).all() and (never["replica"] == 1).all()
    for col in ("first_token_time", "completion_time"):
        np.testing.assert_array_equal(never[col].to_numpy(), alone[col].to_numpy())
    short = _run("+policy=vllm", *LIN, *trace, SPLIT, "+cluster.handoff={decider: short_prompt, threshold: 300}")
    req = short.requests
    local = req["prompt_tokens"] <= 300
    assert 0 < local.sum() < len(req)
    assert (req.loc[local, "prefill_replica"] == -1).all() and (req.loc[~local, "prefill_replica"] == 0).all()
    summary = short.extra["disaggregation"]
    assert summary["whole_on_decode"] == int(local.sum())
    prefix = _run("+policy=vllm", *LIN, *trace, SPLIT, "+cluster.handoff={decider: prefix, threshold: 100000}")
    assert (prefix.requests["prefill_replica"] == -1).all()


def test_the_prefix_decider_keeps_requests_whose_prefix_the_decode_replica_caches(tmp_path):
    """shared_prompt: every request starts with one shared prompt. With prefix caching on, the decode replica caches
    it from the first handed-off request's pulled KV; later requests whose uncached rest is at most the threshold
    run whole there, and the pulls of the others move only what the decode replica does not hold."""
    res = _run("+policy=vllm", "latency=linear", "engine.progress=false", "memory=paged_prefix", "+demand=high",
               "workload=shared_prompt", "workload.num_requests=60", SPLIT,
               "+cluster.handoff={decider: prefix, threshold: 600}")
    req = res.requests
    assert (req["state"] == "done").all()
    local = req["prefill_replica"] == -1
    assert 0 < local.sum() < len(req)
    assert (req["transfer_tokens"] <= req["prompt_tokens"]).all()


#: every policy family on paged memory (vLLM's swap preemption too)
POLICIES = ["vllm", "vllm policy.preemption_mode=swap", "sarathi", "mcsf", "mc_benchmark", "alpha_beta", "rr_sjf",
            "rr", "sjf", "fcfs", "cacheopt", "rlp", "s3"]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_invariants_on_random_instances(policy, seed):
    """Each request served once: handed off exactly when its output has more than one token, its prefill on the
    prefill pool and its decode on the decode pool; arrival <= first token (prefill end) = handoff <= decode
    admission <= transfer start <= transfer end <= completion; a request's events: one admit on each side; no block
    held at the end on any replica; the same run twice is identical."""
    common = [f"+policy={policy.split()[0]}", *policy.split()[1:], "latency=linear", "engine.progress=false", "memory=paged", "+demand=high",
              "workload.num_requests=120", f"seed={seed}", "record.events=true", "router=least_kv",
              "memory.capacity_tokens=6000",
              "+cluster.pools={p: {role: prefill, replicas: 2}, d: {role: decode, replicas: 2}}",
              "+cluster.handoff={gbps: 2}"]
    res = _run(*common)
    req = res.requests
    assert res.status == "completed", res.message
    assert (req["state"] == "done").all()
    handed = req["output_tokens"] > 1
    assert (req.loc[handed, "prefill_replica"].isin([0, 1])).all()
    assert (req.loc[handed, "replica"].isin([2, 3])).all()
    h = req[handed]
    chain = [h["arrival_time"], h["first_token_time"], h["decode_admitted"], h["transfer_start"], h["transfer_end"],
             h["completion_time"]]
    for before, after in zip(chain, chain[1:]):
        assert (before.to_numpy() <= after.to_numpy() + 1e-12).all()
    assert (h["handoff_time"] == h["first_token_time"]).all()
    ev = res.events
    admits = ev[ev["kind"] == "admit"]
    prefill_admits = admits[admits["replica"] < 2].groupby("request_id").size()
    decode_admits = admits[admits["replica"] >= 2].groupby("request_id").size()
    ids = h["request_id"]
    assert (prefill_admits.reindex(ids, fill_value=0) >= 1).all()
    assert (decode_admits.reindex(ids, fill_value=0) >= 1).all()
    assert (ev[ev["kind"] == "finish"].groupby("request_id").size() == 1).all()
    assert res.extra["disaggregation"]["blocks_held_at_end"] == 0
    again = _run(*common)
    pd.testing.assert_frame_equal(again.requests, req)
    pd.testing.assert_frame_equal(again.iterations, res.iterations)


@pytest.mark.parametrize("setting, message", [
    ("+cluster.handoff={flow: prefil_first}", "cluster.handoff.flow='prefil_first': allowed: prefill_first, "
                                              "decode_first"),
    ("+cluster.handoff={decider: short_prompt, threshold: '300'}", "cluster.handoff.threshold='300': allowed: a "
                                                                   "whole number of tokens >= 0"),
    ("+cluster.handoff={decider: short_prompt, threshold: 2.5}", "cluster.handoff.threshold=2.5: allowed"),
    ("+cluster.handoff={decider: short_prompt}", "cluster.handoff.decider=short_prompt needs "
                                                 "cluster.handoff.threshold"),
    ("+cluster.handoff={decider: always, threshold: 10}", "read by the deciders short_prompt and prefix only"),
    ("+cluster.handoff={gbps: -1}", "cluster.handoff.gbps=-1: allowed: a bandwidth > 0"),
    ("+cluster.handoff={link: infiniband}", "cluster.handoff.link='infiniband': allowed: network, nvlink, free"),
    ("+cluster.handoff={speed: 3}", "cluster.handoff.speed: not a handoff setting"),
])
def test_a_bad_handoff_setting_is_one_line(setting, message):
    with pytest.raises(ConfigError) as err:
        _run("+policy=vllm", *LIN, "workload.num_requests=10", "+demand=high", SPLIT, setting)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides, message", [
    (["+cluster.pools={p: {role: prefill, replicas: 1}, d: {role: decode, replicas: 0}}"],
     "cluster.pools.d.replicas=0: allowed: a whole number of replicas"),
    (["+cluster.pools={p: {role: prefill, replicas: 1}, d: {role: decode, hardware: a40_tp2, replicas: 1}}",
      "memory.capacity_tokens=auto"], "cluster.pools.d (hardware a40_tp2): "),
    (["memory=paper", SPLIT], "memory=paper's convention"),
    (["+cluster.handoff={decider: never}"], "cluster.handoff is read by a prefill pool and a decode pool"),
])
def test_a_bad_disaggregated_cluster_is_one_line_before_any_work(overrides, message):
    base = ["+policy=mcsf", "latency=linear", "engine.progress=false", "workload.num_requests=10", "+demand=high"]
    if "memory=paper" not in overrides:
        base.append("memory=paged")
    with pytest.raises(ConfigError) as err:
        _run(*base, *overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_prompt_the_decode_replica_holds_whole_moves_nothing_and_frees_the_prefill_blocks(tmp_path):
    """Two equal 32-token prompts (two whole blocks, one segment), the second after the first is done: the decode
    replica's prefix cache holds the second's whole prompt, so its pull moves 0 tokens, and the prefill replica's
    blocks kept for it are freed at its admission (none held at the end)."""
    path = tmp_path / "t.csv"
    pd.DataFrame({"arrival_time": [0.0, 5.0], "prompt_tokens": [32, 32], "output_tokens": [4, 4],
                  "segments": ["[[7, 32]]", "[[7, 32]]"]}).to_csv(path, index=False)
    res = _run("+policy=vllm", *[x for x in LIN if x != "memory=paged"], "memory=paged_prefix", "workload=trace",
               f"workload.path={path}", SPLIT, "+cluster.handoff={gbps: 10}")
    req = res.requests
    assert (req["state"] == "done").all()
    assert list(req["transfer_tokens"]) == [32, 0]
    assert req["transfer_seconds"].iloc[1] == 0.0
    assert res.extra["disaggregation"]["blocks_held_at_end"] == 0


@pytest.mark.parametrize("lockstep", [False, True])
def test_a_release_reaches_the_prefill_replica_before_its_next_decision(tmp_path, monkeypatch, lockstep):
    """Sarathi (256-token chunks) on a prefill replica of 1,024 tokens (64 blocks), three prompts at t=0: 200
    (13 blocks), 500 (32) and 400 (25), which waits (70 > 64). Iteration 1 (256 tokens: 200 + 56) ends at 0.276:
    request 0 is handed off and pulled at once (200 x 163,840 bytes at 10 GB/s: 3.3 ms, its blocks freed at 0.279277).
    The prefill replica decided at 0.276 before the pull (ties: prefill first), so request 2 is admitted at its next
    decision, 0.552 (iteration 3: request 1's last 188 tokens and request 2's first 68), not later: the prefill
    replica pauses after each handoff (kvstudy/engine/loop.py), and both drivers give this."""
    import functools

    import kvstudy.running.split_run as split_run

    path = tmp_path / "t.csv"
    pd.DataFrame({"arrival_time": [0.0, 0.0, 0.0], "prompt_tokens": [200, 500, 400],
                  "output_tokens": [3, 3, 3]}).to_csv(path, index=False)
    monkeypatch.setattr(split_run, "drive_split", functools.partial(split_run.drive_split, lockstep=lockstep))
    res = _run("+policy=sarathi", "policy.chunk_size=256", *LIN, "memory.capacity_tokens=1024", "workload=trace",
               f"workload.path={path}", SPLIT, "+cluster.handoff={gbps: 10}")
    req = res.requests.set_index("request_id")
    assert req.loc[0, "transfer_end"] == pytest.approx(0.276 + 200 * KV_SHARD / 10e9, abs=1e-12)
    assert req.loc[2, "first_scheduled_time"] == pytest.approx(0.552, abs=1e-12)
    assert req.loc[1, "first_token_time"] == pytest.approx(0.828, abs=1e-12)


@pytest.mark.parametrize("lockstep", [False, True])
def test_a_pull_that_wakes_the_prefill_replica_is_followed_by_its_handoff_in_time(tmp_path, monkeypatch, lockstep):
    """vLLM, a prefill replica of 1,024 tokens (64 blocks), two prompts at t=0: H (600 tokens, 38 blocks, 50 output
    tokens) and W (500, 32 blocks, 3), which waits (70 > 64). H's prefill ends at 0.62 (D0 + 600 D1); the prefill
    replica, W not fitting, sleeps. The decode replica admits H at 0.62 and pulls 600 x 163,840 bytes at 10 GB/s
    (9.8304 ms): its blocks on the prefill replica are freed at 0.6298304, which wakes it: W's prefill (0.52 s) ends
    at 1.1498304. The decode replica's iterations: 0.62 + 0.0098304 + D0 + D1 = 0.6508304, then 0.021 s each; it
    takes W in at its first decision after the handoff, 24 iterations on: 1.1548304. (The decode replica pauses after
    the iteration that pulled, so the driver learns of the release before the decode replica runs past it.)"""
    import functools

    import kvstudy.running.split_run as split_run

    path = tmp_path / "t.csv"
    pd.DataFrame({"arrival_time": [0.0, 0.0], "prompt_tokens": [600, 500],
                  "output_tokens": [50, 3]}).to_csv(path, index=False)
    monkeypatch.setattr(split_run, "drive_split", functools.partial(split_run.drive_split, lockstep=lockstep))
    pools = ("+cluster.pools={p: {role: prefill, replicas: 1, memory: {capacity_tokens: 1024}}, "
             "d: {role: decode, replicas: 1}}")
    res = _run("+policy=vllm", *LIN, "workload=trace", f"workload.path={path}", pools, "+cluster.handoff={gbps: 10}")
    req = res.requests.set_index("request_id")
    pull = 600 * KV_SHARD / 10e9
    assert req.loc[0, "transfer_end"] == pytest.approx(0.62 + pull, abs=1e-12)
    assert req.loc[1, "first_scheduled_time"] == pytest.approx(0.62 + pull, abs=1e-12)
    assert req.loc[1, "handoff_time"] == pytest.approx(0.62 + pull + 0.52, abs=1e-12)
    assert req.loc[1, "decode_admitted"] == pytest.approx(0.62 + pull + D0 + D1 + 24 * (D0 + D1), abs=1e-9)


@pytest.mark.parametrize("lockstep", [False, True])
def test_a_pull_that_wakes_the_prefill_replica_bounds_the_other_decode_replicas(tmp_path, monkeypatch, lockstep):
    """vLLM, a prefill replica of 1,024 tokens, two decode replicas (round robin). G (50 tokens, 100 out) goes to
    decode replica 1, F (50, 100) to replica 2, X (50, 2) to replica 1; H (600, at 0.2888) is handed off at 0.9088 to
    replica 2, which takes it at its next decision, 0.926819; W (500, at 0.29) waits on the prefill replica for H's
    blocks (70 > 64), which the pull frees at 0.93665: W's prefill ends at 1.45665 and it goes to replica 1. Replica
    1 decodes G all along; it must not run past the time a pull on replica 2 could wake the prefill replica (the
    horizon's bound through a sleeping prefill replica), so it takes W in at its first decision after 1.45665
    (1.457638), not after G's last token (2.17)."""
    import functools

    import kvstudy.running.split_run as split_run

    path = tmp_path / "t.csv"
    pd.DataFrame({"arrival_time": [0.0, 0.1, 0.2, 0.2888, 0.29], "prompt_tokens": [50, 50, 50, 600, 500],
                  "output_tokens": [100, 100, 2, 5, 5]}).to_csv(path, index=False)
    monkeypatch.setattr(split_run, "drive_split", functools.partial(split_run.drive_split, lockstep=lockstep))
    pools = ("+cluster.pools={p: {role: prefill, replicas: 1, memory: {capacity_tokens: 1024}}, "
             "d: {role: decode, replicas: 2, router: round_robin}}")
    res = _run("+policy=vllm", *LIN, "workload=trace", f"workload.path={path}", pools, "+cluster.handoff={gbps: 10}")
    req = res.requests.set_index("request_id")
    assert list(req["replica"]) == [1, 2, 1, 2, 1]
    assert req.loc[3, "transfer_end"] == pytest.approx(0.926819 + 600 * KV_SHARD / 10e9, abs=1e-6)
    assert req.loc[4, "handoff_time"] == pytest.approx(req.loc[3, "transfer_end"] + D0 + 500 * D1, abs=1e-12)
    assert 0 <= req.loc[4, "decode_admitted"] - req.loc[4, "handoff_time"] < D0 + 2 * D1  # within one iteration


@pytest.mark.parametrize("deployment", ["p1d3", "p2d2"])
def test_the_horizon_driver_with_prefills_as_short_as_the_latency_model_allows(tmp_path, monkeypatch, deployment):
    """Prompts of 1 to 3 tokens in bursts, one request per batch (max_num_seqs=1): a prefill iteration takes about
    the latency model's least (D0 + D1), the bound the horizon adds to a prefill replica's next decision, while the
    decode replicas decode. The horizon driver and the lockstep give the same run. (Without the bound, or with it
    ten times looser, a decode replica runs past a handoff and this or the cases below fail; twice looser does not
    show on these instances.)"""
    import functools

    import kvstudy.running.split_run as split_run

    rng = np.random.default_rng(3)
    rows = [(0.3 * (k // 20), int(rng.integers(1, 4)), int(rng.integers(2, 40))) for k in range(80)]  # bursts of 20
    common = ["+policy=vllm", "policy.max_num_seqs=1", *LIN, *_trace(tmp_path, rows), f"+deployment={deployment}",
              "+cluster.handoff={gbps: 1}"]
    fast = _run(*common)
    monkeypatch.setattr(split_run, "drive_split", functools.partial(split_run.drive_split, lockstep=True))
    slow = _run(*common)
    pd.testing.assert_frame_equal(fast.requests, slow.requests)
    pd.testing.assert_frame_equal(fast.iterations, slow.iterations)


#: the horizon driver against the lockstep one: every policy family, decode runs on (no events recorded), a link
#: slow enough that pulls from one prefill replica wait for each other; rate 50 keeps queues full, rate 6 leaves
#: gaps between arrivals for the replicas to run ahead in
DRIVER_CASES = [("vllm", "p1d3", 50), ("vllm", "p1d3", 6), ("sarathi", "p2d2", 50), ("sarathi", "p2d2", 6),
                ("mcsf", "p1d3", 50), ("rr_sjf", "p2d2", 6), ("cacheopt", "p1d3", 50),
                ("vllm policy.preemption_mode=swap", "p3d1", 6), ("alpha_beta", "p2d2", 50), ("fcfs", "p1d3", 6)]


@pytest.mark.parametrize("policy, deployment, rate", DRIVER_CASES)
def test_the_horizon_driver_equals_running_one_replica_step_at_a_time(policy, deployment, rate, monkeypatch):
    """kvstudy/cluster/disaggregated.py runs each replica up to its horizon; ``lockstep=True`` runs the earliest one
    only up to the next one's clock (the order every event happens in is the definition): the two give the same run,
    every request and every iteration."""
    import functools

    import kvstudy.running.split_run as split_run

    common = [f"+policy={policy.split()[0]}", *policy.split()[1:], *LIN, "+demand=high", f"demand.rate={rate}",
              "workload.num_requests=150", "memory.capacity_tokens=3000", f"+deployment={deployment}",
              "+cluster.handoff={gbps: 0.2}"]
    fast = _run(*common)
    monkeypatch.setattr(split_run, "drive_split", functools.partial(split_run.drive_split, lockstep=True))
    slow = _run(*common)
    assert fast.status == slow.status == "completed"
    assert len(fast.iterations) > 150
    pd.testing.assert_frame_equal(fast.requests, slow.requests)
    pd.testing.assert_frame_equal(fast.iterations, slow.iterations)


@needs_shared
def test_a_mixed_gpu_split_moves_the_kv_at_the_slower_node_s_speed(tmp_path):
    """Splitwise-HA (H100 prefill, A100 decode) over the measured network: the pull takes the slower end's time (the
    A100 node's send/recv profile; the H100 node's is faster), so one request's transfer equals the all-A100 split's
    and exceeds the all-H100 split's."""
    trace = _trace(tmp_path, [(0.0, 1000, 4)])

    def transfer(p_hw, d_hw):
        pools = (f"+cluster.pools={{p: {{role: prefill, replicas: 1, hardware: {p_hw}}}, "
                 f"d: {{role: decode, replicas: 1, hardware: {d_hw}}}}}")
        res = _run("+policy=vllm", "engine.progress=false", "memory=paged", *trace, pools)
        return res.requests["transfer_seconds"].iloc[0]

    ha, aa, hh = transfer("h100_tp2", "a100_tp2"), transfer("a100_tp2", "a100_tp2"), transfer("h100_tp2", "h100_tp2")
    assert ha == pytest.approx(aa, rel=1e-12)  # (end - start at another clock: equal to the last bits)
    assert aa > 2 * hh > 0


def test_the_timeline_shows_the_handoff_and_the_pull(tmp_path):
    """The instance of the decode replica without room, with events: request 1 runs on the prefill replica, is
    handed off at its first token and waits on the decode replica ("handed off") until request 0 completes, then runs
    there; request 0, admitted at once, has no such segment. The Gantt chart draws each KV pull on its row."""
    import matplotlib

    matplotlib.use("Agg")
    from kvstudy import timeline

    res = _run("+policy=vllm", *LIN, *_trace(tmp_path, [(0.0, 100, 20), (0.001, 100, 3)]),
               "+cluster.pools={p: {role: prefill, replicas: 1}, "
               "d: {role: decode, replicas: 1, memory: {capacity_tokens: 160, watermark: 0.0}}}",
               "+cluster.handoff={gbps: 10}", "record.events=true")
    req = res.requests.set_index("request_id")
    seg = timeline.lives(res.events, res.requests)
    assert list(seg[seg.request_id == 0].state) == ["running", "running"]
    second = seg[seg.request_id == 1].reset_index(drop=True)
    assert list(second.state) == ["waiting", "running", "handed off", "running"]
    assert second.start[2] == pytest.approx(req.loc[1, "handoff_time"], abs=1e-12)
    assert second.end[2] == pytest.approx(req.loc[1, "decode_admitted"], abs=1e-12)
    assert second.end[2] == pytest.approx(req.loc[0, "completion_time"], abs=1e-12)
    ax = timeline.gantt(res)
    assert "KV pull" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_latency_models_least_iteration_time_bounds_every_iteration():
    """``min_iteration_seconds`` (the soonest a prefill replica can hand off after a decision) never exceeds an
    iteration's seconds: Vidur's tables over a run of every iteration kind (Llama2-70B, A100 TP=2), and the linear
    model's d0 + d1 exactly at one token."""
    import kvstudy.running.assemble as assemble
    from kvstudy.latency.models import LinearLatency

    built = []
    original = assemble.build_latency

    def spy(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    try:
        assemble.build_latency = spy
        res = _run("+policy=sarathi", "memory=paged", "+demand=high", "workload.num_requests=150",
                   "engine.progress=false")
    finally:
        assemble.build_latency = original
    bound = built[-1].min_iteration_seconds()
    it = res.iterations
    computing = it[(it["prefill_tokens"] + it["decode_tokens"]) > 0]
    assert 0.0 < bound <= computing["duration"].min()
    assert bound > 0.5 * computing["duration"].min()  # not a trivial bound
    linear = LinearLatency(d0=0.02, d1=0.001)
    assert linear.min_iteration_seconds() == linear.iteration_seconds([(1, 0)], 0, 0) == pytest.approx(0.021)
