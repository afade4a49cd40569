"""KV offload tiers behind the prefix cache (issue 49, kvstudy/memory/offload.py): hand-worked instances of each
rule through the engine, and the independent count on Mooncake's trace with an unlimited tier."""
import json

import numpy as np
import pytest

from kvstudy.costs.swap_models import kv_bytes_per_gpu
from kvstudy.engine.assembly import build_engine
from kvstudy.latency.models import LinearLatency
from kvstudy.latency.tables import HardwareSpec
from kvstudy.memory import PagedMemory
from kvstudy.costs.transfer import network_reader
from kvstudy.memory.offload import OffloadConnector, OffloadTiers, Tier
from kvstudy.memory.prefix import reusable_tokens
from kvstudy.workloads.trace import mooncake_segments
from kvstudy.policies.vllm import VLLM
from kvstudy.running.paths import PROFILES_DIR, SHARED_REFERENCE, load_model_arch
from kvstudy.workloads.requests import make_requests

ARCH = load_model_arch("llama2_70b")
HW = HardwareSpec("a100_tp2", "a100", "a100_pairwise_nvlink", 2)
BLOCK_BYTES = 16 * kv_bytes_per_gpu(ARCH, HW)  # one 16-token block's K and V on one of the two GPUs
D0, D1 = 0.01, 1e-5


def run(requests, segments, capacity_tokens=80, arch=ARCH, hw=HW, **offload):
    """Requests one at a time (10^4 s apart), vLLM on paged memory with prefix caching and the tiers given."""
    from kvstudy.costs.swap_models import PcieSwap

    n = len(requests)
    prompt = np.array([p for p, _ in requests])
    output = np.array([o for _, o in requests])
    reqs = make_requests(np.arange(n) * 1e4, prompt, output, source="test", segments=segments)
    memory = PagedMemory(capacity_tokens, block_size=16, watermark=0.0, prefix_caching=True,
                         offload=offload or None)
    policy = VLLM()
    policy.reset(0)
    engine = build_engine(reqs, output.copy(), policy, LinearLatency(D0, D1), memory, PcieSwap(), arch, hw,
                          progress=False)
    result = engine.run()
    assert result.status == "completed" and (result.requests["state"] == "done").all()
    return result, memory


def first_prefill(result, request_id):
    """The duration of the iteration that ran request ``request_id``'s first prefill."""
    it = result.iterations
    start = result.requests.set_index("request_id").loc[request_id, "first_scheduled_time"]
    return float(it.loc[np.isclose(it["start"], start), "duration"].iloc[0])


# A GPU of five 16-token blocks. A (48 + 2 tokens, four blocks) leaves its three full blocks cached; B (64 + 2 tokens,
# unrelated) needs all five blocks, so A's three are evicted, tail first (blocks 2, 1, 0), and written to the tiers;
# C's prompt (64 tokens) starts with A's 48. C needs five blocks too: B's four cached blocks are evicted as it starts.
A, B, C = [(1, 48)], [(2, 64)], [(1, 48), (3, 16)]
ABC = [(48, 2), (64, 2), (64, 2)]
HOST = dict(host_read_gbps=31.5, host_write_gbps=31.5)
TRANSFER = BLOCK_BYTES / 31.5e9  # one block, one GPU


def test_a_block_evicted_to_host_is_loaded_back_with_its_transfer_time():
    """C finds A's three blocks on the host (none on the GPU) and loads them (blocking): its prefill computes 16
    tokens, not 64, and its first iteration takes the latency model's time plus the transfer."""
    result, memory = run(ABC, [A, B, C], host_gb=1.0, choice="load", **HOST)
    req = result.requests.set_index("request_id")
    assert req.loc[2, "offload_loaded_tokens"] == 48 and req.loc[2, "prefix_cached_tokens"] == 48
    assert 3 * TRANSFER == pytest.approx(2.4966e-4, rel=1e-4)  # 3 x 2,621,440 bytes per GPU over 31.5 GB/s
    assert first_prefill(result, 2) == pytest.approx(D0 + D1 * 16 + 3 * TRANSFER, rel=1e-12)
    host = result.extra["offload"]["tiers"]["host"]
    assert host["read_blocks"] == 3 and host["read_bytes"] == 3 * BLOCK_BYTES
    assert host["written_blocks"] == 7  # A's three (for B), then B's four (for C)


@pytest.mark.parametrize("gbps", [31.5, 0.1])
def test_overlapped_loads_hide_behind_compute_but_one_layer(gbps):
    """Layer by layer: the longer of compute and transfer, plus one of 80 layers' share of the shorter (transfer
    shorter at 31.5 GB/s, longer at 0.1 GB/s)."""
    result, _ = run(ABC, [A, B, C], host_gb=1.0, host_read_gbps=gbps, host_write_gbps=gbps, choice="load",
                    load="overlapped")
    compute, transfer = D0 + D1 * 16, 3 * BLOCK_BYTES / (gbps * 1e9)
    assert first_prefill(result, 2) == pytest.approx(max(compute, transfer) + min(compute, transfer) / 80, rel=1e-12)


@pytest.mark.parametrize("host_blocks, loaded", [(1, 16), (2, 32)])
def test_host_tier_is_lru_and_a_prefix_leaves_after_its_continuation(host_blocks, loaded):
    """B' (63 tokens sharing nothing) takes four blocks: two of A's cached blocks leave the GPU, block 2 then block
    1. C hits A's block 0 on the GPU and continues on the host: with room for one block the host keeps the last one
    written (block 1: block 2 was dropped, least recently used), with room for two both."""
    result, _ = run([(48, 2), (63, 2), (64, 2)], [A, [], C], host_gb=host_blocks * BLOCK_BYTES / 1e9,
                    choice="load", **HOST)
    req = result.requests.set_index("request_id")
    assert req.loc[2, "prefix_cached_tokens"] == 16 + loaded and req.loc[2, "offload_loaded_tokens"] == loaded


def test_a_disk_tier_takes_what_the_host_tier_drops():
    """Host of two blocks over a disk: A's blocks leave the GPU tail first (2, 1, 0), so block 2 is demoted to disk
    and the host keeps 1 and 0. C loads blocks 0 and 1 from the host and block 2 from the disk, each at its tier's
    read bandwidth. The four blocks of B that C's own allocation evicts reach the host after C's lookup (what
    cached_tokens promised is what C gets) and push out everything older: 3 + 4 written to the host, 1 + 4 to disk."""
    result, _ = run(ABC, [A, B, C], host_gb=2 * BLOCK_BYTES / 1e9, disk_gb=1.0, disk_read_gbps=7.0,
                    disk_write_gbps=5.0, choice="load", **HOST)
    req = result.requests.set_index("request_id")
    assert req.loc[2, "offload_loaded_tokens"] == 48
    tiers = result.extra["offload"]["tiers"]
    assert (tiers["host"]["read_blocks"], tiers["disk"]["read_blocks"]) == (2, 1)
    assert (tiers["host"]["written_blocks"], tiers["disk"]["written_blocks"]) == (7, 5)
    assert first_prefill(result, 2) == pytest.approx(D0 + D1 * 16 + 2 * TRANSFER + BLOCK_BYTES / 7.0e9, rel=1e-12)


def test_what_cached_tokens_promises_is_what_start_skips():
    """A host tier of three blocks: C's own allocation evicts B's four blocks, which would push A's three out of the
    host if written before C's lookup; C is promised A's 48 tokens and gets them."""
    result, memory = run(ABC, [A, B, C], host_gb=3 * BLOCK_BYTES / 1e9, choice="load", **HOST)
    assert result.requests.set_index("request_id").loc[2, "offload_loaded_tokens"] == 48


def test_a_loaded_prefix_keeps_its_head_longest():
    """Loads touch a chain tail first: after C loads A's three blocks and two more blocks arrive, a four-block tier
    drops block 2 and keeps 0 and 1, so A's prefix still matches two blocks (touching head first would drop block 0 and
    leave nothing that matches)."""
    view = OffloadConnector(OffloadTiers([Tier("host", 4e-9, 1.0, 1.0)]))
    view.bind(16, 1)
    c0, c1, c2 = key(1, 0), key(1, 1), key(1, 2)
    view.save([c2, c1, c0])
    view.load(0, [c0, c1, c2], 0, 3)
    view.save([key(2, 0), key(3, 0)])
    assert view.pool.match([c0, c1, c2], 0, 3) == [0, 0]


@pytest.mark.parametrize("gbps, loaded", [(18.0, 48), (14.0, 0)])
def test_load_or_recompute_picks_the_cheaper(gbps, loaded):
    """choice=auto: 3 blocks over the link against what those 48 tokens add to C's prefill (48 D1 = 0.48 ms, the
    marginal cost; the iteration's fixed D0 is paid either way): at 18 GB/s the load takes 0.437 ms (loaded), at
    14 GB/s 0.562 ms (recomputed)."""
    result, _ = run(ABC, [A, B, C], host_gb=1.0, host_read_gbps=gbps, host_write_gbps=gbps, choice="auto")
    req = result.requests.set_index("request_id")
    assert req.loc[2, "offload_loaded_tokens"] == loaded
    assert result.extra["offload"]["recomputed_blocks"] == (3 if loaded == 0 else 0)
    assert first_prefill(result, 2) == pytest.approx(
        D0 + D1 * 16 + 3 * BLOCK_BYTES / (gbps * 1e9) if loaded else D0 + D1 * 64, rel=1e-12)


def key(chain: int, j: int) -> int:
    """BlockKeys' key of block j of a chain (16-token blocks): ``chain << 32`` plus the block's end offset."""
    return (chain << 32) + 16 * (j + 1)


def test_tiers_unit():
    view = OffloadConnector(OffloadTiers([Tier("host", 4e-9, 1.0, 1.0)]))
    view.bind(16, 1)  # one byte per block: capacity 4 blocks
    a, b, c, d, e, f, x = (key(n, 0) for n in range(1, 8))
    view.save([a, b, c, d, e])
    assert list(view.pool.tiers[0].blocks) == [b, c, d, e]  # a: least recently written, dropped
    view.load(0, [b], 0, 1)  # touched
    view.save([f])
    assert list(view.pool.tiers[0].blocks) == [d, e, b, f]
    assert view.pool.match([d, e, x, b], 0, 4) == [0, 0]
    assert view.written == [6] and view.read == [1]


def test_skipped_counts_what_the_tiers_hold_at_its_plan_and_after_a_write():
    """choice=recompute: ``skipped`` after ``plan`` counts the blocks that plan found (two), without a second lookup;
    after a write or a load in between it looks the tiers up again (a memo that outlived a write would count two)."""
    view = OffloadConnector(OffloadTiers([Tier("host", 8e-9, 1.0, 1.0)], choice="recompute"))
    view.bind(16, 1)
    c = [key(1, j) for j in range(4)]
    view.save([c[1], c[0]])
    assert view.plan(c, 0, 4, 64) == 0
    view.skipped(c, 0, 4)
    assert view.recomputed_blocks == 2
    assert view.plan(c, 0, 4, 64) == 0
    view.save([c[3], c[2]])  # the chain is whole now
    view.skipped(c, 0, 4)
    assert view.recomputed_blocks == 2 + 4
    view.plan(c, 0, 4, 64)
    view.skipped(c, 1, 4)  # another lookup than the plan's: counted afresh
    assert view.recomputed_blocks == 2 + 4 + 3


def _cluster(shared: bool, x=()):
    """Two replicas, round robin: A (replica 0), X (replica 1, shares nothing; ``x``: its own segments), B (replica 0:
    evicts A's three blocks into the tiers), C (replica 1: its GPU never held A's blocks)."""
    from kvstudy.cluster.driver import drive, merge
    from kvstudy.cluster.routers import RoundRobin
    from kvstudy.costs.swap_models import PcieSwap

    lengths = [(48, 2), (16, 2), (64, 2), (64, 2)]
    prompt, output = np.array([p for p, _ in lengths]), np.array([o for _, o in lengths])
    reqs = make_requests(np.arange(4) * 1e4, prompt, output, source="test", segments=[A, list(x), B, C])
    engines = []
    for k in range(2):
        memory = PagedMemory(80, block_size=16, watermark=0.0, prefix_caching=True,
                             offload=dict(host_gb=1.0, choice="load", shared=shared, **HOST))
        policy = VLLM()
        policy.reset(k)
        engines.append(build_engine(reqs, output.copy(), policy, LinearLatency(D0, D1), memory, PcieSwap(), ARCH, HW,
                                    progress=False))
    if shared:  # the pool's 1 GB twice (per GPU, two replicas): room for every block either way
        assert engines[0].memory.connector.connect_replicas([e.memory.connector for e in engines],
                                                            lambda: network_reader(NETWORK))
    router = RoundRobin()
    router.reset(0)
    results, routed = drive(engines, router, reqs.arrival_time.tolist())
    return merge(engines, results, routed, "round_robin")


NETWORK = PROFILES_DIR / "network" / "a100_pairwise_nvlink" / "send_recv.csv"


def test_a_shared_pool_serves_a_request_routed_to_another_replica():
    """C (replica 1) finds A's three blocks, which replica 0 evicted into the pool: read from replica 0's node over
    the network, one transfer of 3 blocks at the node's send/recv time between nodes (interpolated by hand here)."""
    import pandas as pd

    result = _cluster(shared=True)
    req = result.requests.set_index("request_id")
    assert list(req["replica"]) == [0, 1, 0, 1]
    assert req.loc[3, "offload_loaded_tokens"] == 48
    assert result.extra["offload"]["remote_blocks"] == 3
    rows = pd.read_csv(NETWORK)
    rows = rows[rows["devices_per_node"] == 1].sort_values("size")
    size = 3 * BLOCK_BYTES
    below, above = rows[rows["size"] <= size].iloc[-1], rows[rows["size"] > size].iloc[0]
    frac = (np.log(size) - np.log(below["size"])) / (np.log(above["size"]) - np.log(below["size"]))
    ms = below["time_stats.send_recv.median"] + frac * (above["time_stats.send_recv.median"]
                                                        - below["time_stats.send_recv.median"])
    it = result.iterations
    start = req.loc[3, "first_scheduled_time"]
    duration = float(it.loc[(it["replica"] == 1) & np.isclose(it["start"], start), "duration"].iloc[0])
    assert duration == pytest.approx(D0 + D1 * 16 + ms / 1e3, rel=1e-9)
    # per replica, the same requests find nothing: replica 1's own tiers never saw A's blocks
    alone = _cluster(shared=False).requests.set_index("request_id")
    assert alone.loc[3, "offload_loaded_tokens"] == 0


def test_a_shared_pool_names_a_block_alike_on_every_replica():
    """X (replica 1's first request) has content of its own: replica 1 met X's segment first, replica 0 A's, and with
    a namer per replica both were chain 0, so C (A's content, on replica 1) missed A's blocks in the pool (and a
    request with X's content would have found A's). One namer for the pool: C loads A's three blocks."""
    req = _cluster(shared=True, x=[(9, 16)]).requests.set_index("request_id")
    assert list(req["offload_loaded_tokens"]) == [0, 0, 0, 48]


MOONCAKE = SHARED_REFERENCE / "traces-extra" / "mooncake"


@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"needs Mooncake's traces in {MOONCAKE} (../shared, present in CI)")
@pytest.mark.parametrize("name", ["conversation_trace.jsonl", "synthetic_trace.jsonl"])
def test_unlimited_tier_serves_the_independent_count_through_the_engine(name):
    """A GPU that holds one request (evicting nearly every block the next one does not share) and an unlimited host
    tier, requests one at a time: each request's cached tokens (GPU hit + loaded) equal the independent count (the
    longest run of its leading trace blocks seen before), as issue 36's test finds for an unlimited GPU cache. The
    first 1,000 requests of each trace here; the whole traces (37.4% and 65.1%): bench/offload_count.py."""
    import dataclasses

    with open(MOONCAKE / name) as f:
        trace = [json.loads(line) for _, line in zip(range(1000), f)]
    prompt = [r["input_length"] for r in trace]
    output = [r["output_length"] for r in trace]
    segments = [mooncake_segments(r["hash_ids"], p) for r, p in zip(trace, prompt)]
    capacity = (max(p + o for p, o in zip(prompt, output)) // 16 + 2) * 16
    arch = dataclasses.replace(load_model_arch("llama31_8b"), max_model_len=262144)  # the synthetic trace's 191k
    result, _ = run(list(zip(prompt, output)), segments, capacity_tokens=capacity, arch=arch,
                    hw=HardwareSpec("a100_tp1", "a100", "a100_pairwise_nvlink", 1), host_gb=1e9, choice="load",
                    **HOST)
    got = result.requests.sort_values("request_id")["prefix_cached_tokens"].tolist()
    want = reusable_tokens([r["hash_ids"] for r in trace], prompt)
    assert got == want
    loaded = int(result.requests["offload_loaded_tokens"].sum())
    assert loaded > 0.5 * sum(want)  # most of it from the host: the GPU kept little
    assert sum(want) > 0.1 * sum(prompt)  # the trace does share prefixes


@pytest.mark.parametrize("overrides, match", [
    (["memory.prefix_caching=false"], "memory.offload: the tiers hold the prefix cache's evicted blocks"),
    (["memory.offload.host_gb=-1"], "memory.offload.host_gb=-1: allowed"),
    (["memory.offload.load=async"], "memory.offload.load='async': allowed blocking, overlapped"),
    (["memory.offload.choice=never"], "memory.offload.choice='never': allowed auto, load, recompute"),
])
def test_bad_offload_settings_are_one_line(overrides, match):
    from kvstudy import api
    from kvstudy.errors import ConfigError

    with pytest.raises(ConfigError, match=match.replace("(", "\\\\(").replace(")", "\\\\)")):
        api.simulate(api.compose(["+policy=vllm", "memory=paged_offload", "workload=shared_prompt", "+demand=high",
                                  "latency=linear", *overrides]))


def test_no_tier_is_the_prefix_cache_alone():
    """host_gb=null (and no disk): the run is memory=paged_prefix's, to the last bit (the study's "none")."""
    from kvstudy import api

    common = ["+policy=vllm", "workload=shared_prompt", "+demand=high", "latency=linear", "workload.num_requests=200",
              "memory.capacity_tokens=2048"]
    a, _ = api.simulate(api.compose([*common, "memory=paged_prefix"]))
    b, _ = api.simulate(api.compose([*common, "memory=paged_offload", "memory.offload.host_gb=null"]))
    assert a.requests.equals(b.requests) and a.iterations.equals(b.iterations)
    c, summary = api.simulate(api.compose([*common, "memory=paged_offload", "memory.offload.host_gb=1e9"]))
    assert summary["offload"]["tiers"]["host"]["written_blocks"] > 0  # the same run does evict, and tiers catch it


def test_a_shared_pool_through_the_command_line_is_every_replicas_memory_in_time_order():
    """`cluster.replicas=2 memory.offload.shared=true`: one pool of 2 x host_gb, replicas stepped in lockstep
    (kvstudy/cluster/driver.py); the same run twice gives the same result. (Remote reads by hand: the test above.)"""
    from kvstudy import api

    cfg = api.compose(["+policy=vllm", "memory=paged_offload", "workload=shared_prompt", "+demand=high",
                       "latency=linear", "workload.num_requests=300", "memory.capacity_tokens=6144",
                       "cluster.replicas=2", "memory.offload.shared=true", "memory.offload.host_gb=0.5"])
    a, summary = api.simulate(cfg)
    assert summary["status"] == "completed"
    assert summary["memory"]["offload"]["tiers"][0]["capacity_gb"] == 1.0 and summary["memory"]["offload"]["shared"]
    assert summary["offload"]["loaded_tokens"] > 0
    b, _ = api.simulate(cfg)
    assert a.requests.equals(b.requests)
