"""The KV connector seam (issue 56, kvstudy/memory/connector.py): a connector selected by configuration
(``memory.connector._target_``) is called by the memory and the engine as the protocol says, its loads are timed
with the iteration, and its records reach the run's tables; "no connector" leaves a run as it was."""
import json

import pytest

from kvstudy import api
from kvstudy.errors import KvStudyError
from kvstudy.memory.base import MemoryModel
from kvstudy.memory.connector import KVConnector, NoConnector
from tests.connector_toys import KeepsEverything, Recorder

BASE = ["workload=trace", "workload.hash_block_size=16", "model=llama32_1b", "hardware=a100_tp1", "memory=paged",
        "memory.prefix_caching=true", "memory.watermark=0", "latency=linear", "engine.progress=false", "+policy=vllm"]
#: A (blocks 1-2) and B (3-4) run and finish; C (5-7) needs A's blocks' room (6 blocks of 16 tokens): A's two are
#: evicted, to the connector; D repeats A's prompt: its two blocks come back from the connector, not the GPU
ROWS = [(0.0, 32, 2, [1, 2]), (1.0, 32, 2, [3, 4]), (2.0, 48, 2, [5, 6, 7]), (4.0, 33, 2, [1, 2])]


def run(tmp_path, *overrides):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"arrival_time": t, "prompt_tokens": p, "output_tokens": o, "hash_ids": ids})
                            + "\n" for t, p, o, ids in ROWS))
    return api.simulate(api.compose(BASE + [f"workload.path={path}", "memory.capacity_tokens=96", *overrides]))


def test_both_connectors_implement_the_protocol():
    assert isinstance(NoConnector(), KVConnector)
    assert isinstance(KeepsEverything(0.0), KVConnector) and isinstance(Recorder(), KVConnector)


def test_a_connector_selected_by_configuration_is_called_as_the_protocol_says(tmp_path):
    result, summary = run(tmp_path, "+memory.connector._target_=tests.connector_toys.Recorder",
                          "+memory.connector.tag=t1")
    calls = Recorder.calls
    assert calls[0][:2] == ("bind", 16) and calls[1][0] == "set_timing"
    assert [c[1] for c in calls if c[0] == "looked_up"] == [32, 32, 48, 33]  # every prefill start, in order
    assert ("save", 2) in calls  # A's two blocks, evicted for C
    assert summary["memory"]["offload"] == {"name": "recorder", "tag": "t1"}
    assert "offload_loaded_tokens" not in result.requests  # summary() is None: nothing to record


def test_blocks_the_connector_keeps_come_back_at_its_price(tmp_path):
    """D's two blocks are loaded (32 tokens: at most (33 - 1) // 16 = 2 blocks) and its prefill computes 1 token; the
    iteration that starts it takes 2 x 0.25 s more than the same run with free loads, and no other iteration
    changes. Kept at the end: A's two blocks (evicted for C) and B's two (evicted for D's third block)."""
    plain, _ = run(tmp_path)
    free, _ = run(tmp_path, "+memory.connector._target_=tests.connector_toys.KeepsEverything",
                  "+memory.connector.seconds_per_block=0")
    result, summary = run(tmp_path, "+memory.connector._target_=tests.connector_toys.KeepsEverything",
                          "+memory.connector.seconds_per_block=0.25")
    assert plain.requests.prefix_cached_tokens.tolist() == [0, 0, 0, 0]
    assert result.requests.offload_loaded_tokens.tolist() == [0, 0, 0, 32]
    assert result.requests.prefix_cached_tokens.tolist() == [0, 0, 0, 32]
    assert summary["offload"] == {"kept_blocks": 4, "loaded_blocks": 2, "loaded_tokens": 32}
    it, it0 = result.iterations, free.iterations
    assert it.prefill_tokens.tolist() == it0.prefill_tokens.tolist() and 1 in it.prefill_tokens.tolist()
    extra = (it.duration - it0.duration).round(12).tolist()
    d_start = it.prefill_tokens.tolist().index(1)
    assert extra[d_start] == 0.5 and all(x == 0 for k, x in enumerate(extra) if k != d_start)


def test_no_connector_is_the_default_and_a_connector_needs_the_prefix_cache(tmp_path):
    result, summary = run(tmp_path)
    assert "offload" not in summary["memory"] and "offload" not in summary
    with pytest.raises(KvStudyError, match="memory.connector: a connector moves the prefix cache's blocks"):
        run(tmp_path, "memory.prefix_caching=false", "+memory.connector._target_=tests.connector_toys.Recorder")


def test_every_memory_model_has_a_connector_and_a_prefix_index():
    from kvstudy.memory.paper import PaperMemory
    from kvstudy.memory.paged import PagedMemory

    for mem in (PaperMemory(100), PagedMemory(64, block_size=4)):
        assert isinstance(mem, MemoryModel)
        assert mem.connector.iteration_seconds(1.5) == 1.5 and mem.cache.hit(["a"]) == 0


@pytest.mark.parametrize("overrides,message", [
    (["+memory.connector._target_=nope.Nope"], "memory.connector._target_=nope.Nope: no module named 'nope'"),
    (["+memory.connector._target_=tests.connector_toys.KeepsEverything", "+memory.connector.seconds_per_block=-1"],
     "memory.connector (tests.connector_toys.KeepsEverything): memory.connector.seconds_per_block=-1: allowed"),
    (["+memory.connector._target_=tests.connector_toys.KeepsEverything", "+memory.connector.bogus=1"],
     "memory.connector.bogus: not a setting of memory.connector"),
    (["+memory.connector._target_=collections.OrderedDict"],
     "memory.connector._target_=collections.OrderedDict built OrderedDict, not a KV connector: it lacks name"),
    (["+memory.connector=5"], "memory.connector=5: allowed a mapping with _target_"),
])
def test_a_connector_that_cannot_be_built_is_one_line_naming_it(tmp_path, overrides, message):
    with pytest.raises(KvStudyError) as info:
        run(tmp_path, *overrides)
    assert str(info.value).startswith(message) and "\n" not in str(info.value), str(info.value)


def test_a_clusters_summary_sums_the_replicas_counts_by_default():
    """``NoConnector.merged_summary`` (what a connector of one's own inherits): numbers summed, the rest replica 0's,
    with every replica's loaded tokens."""
    parts = [{"kept_blocks": 3, "loaded_blocks": 1, "mode": "a"}, {"kept_blocks": 4, "loaded_blocks": 0, "mode": "b"}]
    assert NoConnector().merged_summary(parts, 48) == {"kept_blocks": 7, "loaded_blocks": 1, "mode": "a",
                                                       "loaded_tokens": 48}


# --- the one transfer-cost model (kvstudy/costs/transfer.py) and its instances -------------------------------------
def test_a_link_is_bytes_over_its_bandwidth_plus_its_fixed_costs():
    from kvstudy.costs.transfer import Link, layerwise

    link = Link(25.0, efficiency=0.8, per_copy_s=1e-5, per_layer_s=2e-6, layers=40)
    assert link.seconds(0) == 0.0
    assert link.seconds(2e9, copies=3) == pytest.approx(2e9 / (25e9 * 0.8) + 40 * 2e-6 + 3 * 1e-5, rel=1e-15)
    assert Link(rate=lambda n: 2.0 * n).seconds(8e9, copies=4) == pytest.approx(1.0)
    assert layerwise(3.0, 1.0, 4) == 3.25 and layerwise(1.0, 3.0, 4) == 3.25
    with pytest.raises(ValueError, match="allowed gbps > 0"):
        Link(0.0)


def test_the_swap_models_are_links():
    """``pcie``: PCIe at 80% plus 10 us per layer; ``vllm_blocks``: vLLM PR 11531's fitted per-block rate, 1.21 GB/s
    for one block and 3.11 GB/s for 1,250 (its two measurements)."""
    from kvstudy.costs.swap_models import PcieSwap, VllmBlocksSwap
    from kvstudy.latency.tables import HardwareSpec
    from kvstudy.running.paths import load_model_arch

    arch, hw = load_model_arch("llama2_70b"), HardwareSpec("a100_tp2", "a100", "a100_pairwise_nvlink", 2)
    pcie = PcieSwap().bind(arch, hw, 16)
    block = 16 * arch.kv_bytes_per_token(2)
    assert pcie.seconds(10) == pytest.approx(10 * block / (31.5e9 * 0.8) + 80 * 10e-6, rel=1e-15)
    blocks = VllmBlocksSwap().bind(arch, hw, 16)
    assert blocks.seconds(1) == pytest.approx(block / 1.21e9, rel=1e-12)
    assert blocks.seconds(1250) == pytest.approx(1250 * block / 3.11e9, rel=1e-12)
