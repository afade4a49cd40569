"""Pools of replicas (issue 57, kvstudy/cluster/pools.py, kvstudy/running/pool_setup.py): one mixed pool written out
is ``cluster.replicas`` bit for bit; a mixed-GPU pool gives each replica its own hardware's KV capacity, and a request
one replica cannot hold goes to one that can; every bad pool setting is one line naming it, before any work."""
import pandas as pd
import pytest

from kvstudy import api
from kvstudy.errors import ConfigError

FAST = ["latency=linear", "engine.progress=false", "+demand=high", "workload.num_requests=240"]


def _run(*overrides):
    return api.simulate(api.compose(list(overrides) + FAST))


@pytest.mark.parametrize("setup, router", [
    (["+policy=vllm", "memory=paged"], "least_kv"),
    (["+policy=mcsf"], "round_robin"),
    (["+policy=sarathi", "workload=shared_prompt", "memory=paged_prefix"], "prefix_affinity"),
])
def test_one_mixed_pool_is_cluster_replicas_bit_for_bit(setup, router):
    plain, _ = _run(*setup, f"router={router}", "cluster.replicas=3")
    pooled, summary = _run(*setup, f"router={router}", "+cluster.pools={main: {role: mixed, replicas: 3}}")
    pd.testing.assert_frame_equal(pooled.requests, plain.requests)
    pd.testing.assert_frame_equal(pooled.iterations, plain.iterations)
    assert pooled.status == plain.status
    assert [p["hardware"] for p in pooled.extra["cluster"]["per_replica"]] == ["a100_tp2"] * 3


def test_the_pool_hardware_named_as_the_run_s_gives_the_same_run():
    plain, _ = _run("+policy=vllm", "memory=paged", "cluster.replicas=2")
    named, _ = _run("+policy=vllm", "memory=paged", "+cluster.pools={main: {replicas: 2, hardware: a100_tp2}}")
    pd.testing.assert_frame_equal(named.requests, plain.requests)
    pd.testing.assert_frame_equal(named.iterations, plain.iterations)


def test_a_mixed_gpu_pool_gives_each_replica_its_hardware_s_capacity_and_routes_around_refusals():
    """At 86.6% of GPU memory, Llama2-70B on two A100s leaves 1,040 tokens of KV and on four 425,248: the long
    requests the small replica refuses up front go to the big one, none is rejected, and each replica's summary names
    its hardware and capacity."""
    common = ["+policy=vllm", "memory=paged", "memory.capacity_tokens=auto", "memory.gpu_memory_utilization=0.866",
              "router=round_robin"]
    res, _ = _run(*common, "+cluster.pools={main: {role: mixed, hardware: [a100_tp2, a100_tp4]}}")
    per = res.extra["cluster"]["per_replica"]
    assert [(p["hardware"], p["kv_capacity_tokens"]) for p in per] == [("a100_tp2", 1040), ("a100_tp4", 425248)]
    req = res.requests
    assert (req["state"] == "done").all()
    small = api.simulate(api.compose(common + FAST + ["hardware=a100_tp2"]))[0].requests
    refused = small["state"] == "rejected"
    assert refused.sum() > 0  # the instance has requests the small replica cannot hold ...
    assert (req.loc[refused.to_numpy(), "replica"] == 1).all()  # ... and each went to the big one
    assert (req["replica"] == 0).sum() > 0  # the small replica served the rest of its turns


@pytest.mark.parametrize("pools, message", [
    ("{d: {role: decode, replicas: 0}}", "cluster.pools.d.replicas=0: allowed: a whole number of replicas, 1 to 1024"),
    ("{m: {role: mixd, replicas: 2}}", "cluster.pools.m.role='mixd': allowed: mixed, prefill, decode"),
    ("{m: {replicas: 2, hardware: h100_tp3}}", "cluster.pools.m.hardware='h100_tp3': unknown hardware; allowed: "),
    ("{m: {hardware: [a100_tp2, nope]}}", "cluster.pools.m.hardware[1]='nope': unknown hardware"),
    ("{m: {replicas: 3, hardware: [a100_tp2, a100_tp4]}}", "cluster.pools.m.hardware lists 2 replica(s) but "
                                                             "cluster.pools.m.replicas=3"),
    ("{m: {replicas: 2, gpus: 4}}", "cluster.pools.m.gpus=4: not a pool setting; allowed: role, replicas, hardware"),
    ("{m: {role: mixed}}", "cluster.pools.m.replicas=null: missing"),
    ("{m: {replicas: 2.5}}", "cluster.pools.m.replicas=2.5: allowed: a whole number"),
    ("{m: {replicas: 2, policy: vlm}}", "cluster.pools.m.policy='vlm': unknown policy; allowed: "),
    ("{m: {replicas: 2, router: rr}}", "cluster.pools.m.router='rr': unknown router; allowed: "),
    ("{m: {replicas: 2, memory: 5}}", "cluster.pools.m.memory=5: allowed: a mapping of memory settings"),
    ("{p: {role: prefill, replicas: 1}, d: {role: mixed, replicas: 3}}",
     "cluster.pools: p (prefill), d (mixed): a mixed pool beside others is not built (a router over pools)"),
    ("{a: {replicas: 1}, b: {replicas: 1}}", "cluster.pools: a (mixed), b (mixed): a mixed pool beside others"),
    ("{p: {role: prefill, replicas: 2}}", "cluster.pools: p (prefill): a prefill pool needs a decode pool"),
    ("{d: {role: decode, replicas: 2}}", "cluster.pools: d (decode): a decode pool needs a prefill pool"),
    ("{p: {role: prefill, replicas: 1}, q: {role: prefill, replicas: 1}, d: {role: decode, replicas: 1}}",
     "allowed: one pool of each role"),
    ("{m: {hardware: [a100_tp2, null]}}", "cluster.pools.m.hardware[1]=None: allowed: a hardware option's name"),
    ("{m: {replicas: 2, memory: false}}", "cluster.pools.m.memory=False: allowed: a mapping of memory settings"),
    ("{m: {replicas: 2, memory: {foo: 1}}}", "cluster.pools.m.memory.foo: not a setting of the run's memory (paged)"),
    ("{m: {replicas: 2, policy: mcsf_prefix}}", "cluster.pools.m.policy=mcsf_prefix: runs with "
                                                "memory.prefix_caching=true, the run's is false; allowed: give the pool "
                                                "memory: {prefix_caching: true}"),
    ("{1x: {replicas: 2}}", "cluster.pools.1x: pool name '1x' not allowed"),
    ("{a.b: {replicas: 2}}", "cluster.pools.a.b: pool name 'a.b' not allowed"),
])
def test_a_bad_pool_is_one_line_naming_it(pools, message):
    with pytest.raises(ConfigError) as err:
        _run("+policy=vllm", "memory=paged", f"+cluster.pools={pools}")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_pools_beside_cluster_replicas_is_refused():
    with pytest.raises(ConfigError, match=r"cluster.replicas=2 beside cluster.pools: give the replicas in the pools"):
        _run("+policy=vllm", "memory=paged", "cluster.replicas=2", "+cluster.pools={m: {replicas: 2}}")


def test_a_pool_whose_hardware_cannot_hold_the_model_is_named_before_any_work():
    """Llama2-70B's weights (about 129 GiB) do not fit two A40s (96 GB): the pool is named."""
    with pytest.raises(ConfigError) as err:
        _run("+policy=vllm", "memory=paged", "memory.capacity_tokens=auto",
             "+cluster.pools={m: {hardware: [a100_tp2, a40_tp2]}}")
    text = str(err.value)
    assert text.startswith("cluster.pools.m (hardware a40_tp2): ")
    assert "\n" not in text


def test_a_pool_s_own_policy_and_memory_are_its_replicas():
    res, _ = _run("+policy=vllm", "memory=paged",
                  "+cluster.pools={m: {replicas: 2, policy: sarathi, memory: {capacity_tokens: 8192}}}")
    assert res.extra["policy"] == "sarathi"  # what its replicas ran
    assert [p["kv_capacity_tokens"] for p in res.extra["cluster"]["per_replica"]] == [8192, 8192]
    alone = api.simulate(api.compose(["+policy=sarathi", "memory=paged", "memory.capacity_tokens=8192",
                                      "cluster.replicas=2"] + FAST))[0]
    pd.testing.assert_frame_equal(res.requests, alone.requests)


def test_a_pool_naming_the_run_s_hardware_keeps_the_run_s_overrides_of_it():
    common = ["+policy=vllm", "memory=paged", "memory.capacity_tokens=auto", "hardware.memory_gb_per_gpu=90"]
    plain, _ = _run(*common, "cluster.replicas=2")
    named, _ = _run(*common, "+cluster.pools={m: {replicas: 2, hardware: a100_tp2}}")
    assert [p["kv_capacity_tokens"] for p in named.extra["cluster"]["per_replica"]] == [plain.capacity] * 2
    pd.testing.assert_frame_equal(named.requests, plain.requests)


def test_a_pool_policy_on_another_memory_model_is_refused():
    with pytest.raises(ConfigError, match=r"^cluster.pools.m.policy=vllm: runs on memory=paged, the run's memory is "
                                          r"paper; allowed: a policy of the run's memory model"):
        _run("+policy=mcsf", "+cluster.pools={m: {replicas: 2, policy: vllm}}")


def test_a_pool_of_one_replica_is_the_single_engine_run():
    alone, s1 = _run("+policy=vllm", "memory=paged")
    pooled, s2 = _run("+policy=vllm", "memory=paged", "+cluster.pools={m: {replicas: 1}}")
    pd.testing.assert_frame_equal(pooled.requests, alone.requests)
    pd.testing.assert_frame_equal(pooled.iterations, alone.iterations)
    other, _ = _run("+policy=vllm", "memory=paged", "+cluster.pools={m: {replicas: 1, hardware: h100_tp2}}")
    direct, _ = _run("+policy=vllm", "memory=paged", "hardware=h100_tp2")
    pd.testing.assert_frame_equal(other.requests, direct.requests)
    assert other.extra["hardware"] == "h100_tp2" and "cluster" not in other.extra


def test_a_mixed_gpu_summary_names_every_hardware_and_a_shared_offload_pool_across_them_is_refused():
    res, _ = _run("+policy=vllm", "memory=paged", "+cluster.pools={m: {hardware: [a100_tp2, a100_tp4]}}")
    assert res.extra["hardware"] == "a100_tp2+a100_tp4"
    with pytest.raises(ConfigError, match=r"^memory.offload.shared=true with replicas of different hardware"):
        _run("+policy=vllm", "memory=paged_offload", "memory.offload.host_gb=1", "memory.offload.shared=true",
             "+cluster.pools={m: {hardware: [a100_tp2, a100_tp4]}}")
