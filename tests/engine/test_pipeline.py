"""Pipeline parallelism as Vidur runs it (issue 58, kvstudy/engine/pipeline.py): batches in flight, one per stage,
the hop between stages, a batch formed when the first stage frees, its requests hidden from the policy until its
last stage ends. Hand-worked timings on the linear model, and every policy on a pipelined replica."""
import copy

import numpy as np
import pytest

from kvstudy import api
from kvstudy.engine.pipeline import Pipeline
from kvstudy.errors import ConfigError
from kvstudy.latency.models import LinearLatency, UnitLatency
from kvstudy.latency.tables import HardwareSpec
from kvstudy.memory import PagedMemory
from kvstudy.policies.vllm import VLLM, Sarathi
from kvstudy.engine.assembly import build_engine
from kvstudy.costs.swap_models import PcieSwap
from tests.conftest import make_instance
from tests.step_helpers import ARCH, Recorder, prepare

HW2 = HardwareSpec("a100_tp2", "a100", "a100_pairwise_nvlink", 2, pipeline_parallel=2)


def engine(req, policy, hw=HW2, latency=None, capacity=64, block_size=4, memory=None, **kw):
    prepare(policy, req)
    policy.reset(0)
    memory = memory or PagedMemory(capacity, block_size=block_size, watermark=0.0, swap_space_gb=4.0,
                                   decode_block_check="boundary")
    latency = latency or LinearLatency(d0=1.0, d1=0.0, hop=0.5, hardware=hw)
    return build_engine(req, req.output_tokens, policy, latency, memory, PcieSwap(), ARCH, hw, **kw)


def test_stage_clocks_by_hand():
    """Two stages, compute 0.5 s per stage, hop 0.5 s: a batch at 0 holds stage 0 for 1.0 s and ends at 1.5; the next,
    formed at 1.0, starts stage 1 when it frees at 2.0 and ends at 2.5; a third may not form before the first ends."""
    pipe = Pipeline(2)
    assert pipe.place(0.0, 1.5, 0.5) == 1.5
    assert pipe.next_decision(0.0) == 1.0
    assert pipe.place(1.0, 1.5, 0.5) == 2.5
    pipe.flight.extend([type("B", (), {"end": 1.5})(), type("B", (), {"end": 2.5})()])
    assert pipe.next_decision(1.0) == 2.0  # the first stage frees at 2.0, after the oldest batch ended (1.5)
    # a long batch ahead holds the second stage: the short one behind it waits there
    pipe = Pipeline(2)
    pipe.place(0.0, 4.0, 0.0)  # 2.0 per stage: stage 1 busy until 4.0
    assert pipe.place(2.0, 1.0, 0.0) == 4.5  # stage 0 [2.0, 2.5], stage 1 [4.0, 4.5]


def test_two_batches_in_flight_and_a_hop_by_hand():
    """vLLM, two requests of 3 tokens (the first from the prefill), A at 0 and B at 0.2; every batch's whole time is
    d0 + (2 - 1) hop = 1.5 s, stage 0 taking 1.0 (compute 0.5 + hop 0.5), stage 1 0.5:

    batch 1 prefill A [0, 1.0][1.0, 1.5]; batch 2 prefill B [1.0, 2.0][2.0, 2.5] (A is in flight: B alone);
    batch 3 decode A at 2.0 (A back at 1.5; a third batch waits for the first stage) -> 3.5; batch 4 decode B at 3.0
    -> 4.5; batch 5 decode A at 4.0 -> 5.5 (done); batch 6 decode B at 5.0 -> 6.5 (done)."""
    req = make_instance([10, 10], [3, 3], [0.0, 0.2])
    res = engine(req, VLLM(max_num_seqs=8)).run()
    q = res.requests
    assert res.status == "completed"
    assert q.first_token_time.tolist() == pytest.approx([1.5, 2.5])
    assert q.completion_time.tolist() == pytest.approx([5.5, 6.5])
    it = res.iterations
    assert it.start.tolist() == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    assert it.duration.tolist() == pytest.approx([1.5, 1.5, 1.5, 1.5, 1.5, 1.5])
    assert it.batch_size.tolist() == [1] * 6
    # the same requests on one stage of the whole model (1 s per batch): A prefills at 0, B at 1, both decode at 2, 3
    flat = engine(req, VLLM(max_num_seqs=8), hw=HardwareSpec("a100_tp2", "a100", "a100_pairwise_nvlink", 2),
                  latency=LinearLatency(d0=1.0, d1=0.0)).run().requests
    assert flat.completion_time.tolist() == pytest.approx([4.0, 4.0])


def test_no_third_batch_forms_while_two_are_in_flight():
    """0.125 s per token, two stages, no hop: A's prefill of 16 tokens at 0 holds each stage 1.0 s (ends 2.0); B's of 8
    at 1.0 holds stage 0 [1.0, 1.5] and waits for stage 1 [2.0, 2.5]. The first stage frees at 1.5, but two batches are
    in flight until A's ends: C (arrived at 1.2) is prefilled at 2.0, not 1.5."""
    req = make_instance([16, 8, 8], [2, 2, 2], [0.0, 0.1, 1.2])
    res = engine(req, VLLM(max_num_seqs=8), latency=LinearLatency(d0=0.0, d1=0.125, hardware=HW2)).run()
    assert res.iterations.start.tolist()[:3] == pytest.approx([0.0, 1.0, 2.0])
    assert res.requests.first_token_time.tolist() == pytest.approx([2.0, 2.5, 3.0])


def test_sarathi_chunks_of_two_prompts_interleave_in_the_pipeline():
    """Sarathi with chunks of 4 tokens, two prompts of 8 at 0, two stages, every batch 1.0 s whole (0.5 per stage):
    A's first chunk [0, 1.0]; B's first chunk at 0.5 (A is in flight) -> 1.5; A's last chunk at 1.0 -> 2.0 (its first
    token); B's last chunk at 1.5 -> 2.5; A decodes at 2.0 -> 3.0 (done), B at 2.5 -> 3.5 (done)."""
    req = make_instance([8, 8], [2, 2])
    res = engine(req, Sarathi(chunk_size=4, max_num_seqs=8), latency=LinearLatency(d0=1.0, d1=0.0, hardware=HW2)).run()
    q = res.requests
    assert q.first_token_time.tolist() == pytest.approx([2.0, 2.5])
    assert q.completion_time.tolist() == pytest.approx([3.0, 3.5])
    assert res.iterations.start.tolist() == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])


def test_a_batch_holds_at_most_its_share_of_max_num_seqs():
    """max_num_seqs=4 on two stages: at most 2 requests per batch (Vidur's _max_micro_batch_size), at most 4 holding
    KV; six requests arriving at once fill both pipeline slots, so batches overlap in time."""
    req = make_instance([4] * 6, [5] * 6)
    res = engine(req, VLLM(max_num_seqs=4), latency=LinearLatency(d0=1.0, d1=0.0, hardware=HW2)).run()
    assert res.status == "completed"
    it = res.iterations
    assert it.batch_size.max() == 2
    assert ((it.start.to_numpy()[1:] < (it.start + it.duration).to_numpy()[:-1])).any()  # two in flight at once
    # one token per request per whole batch time (1 s): never faster, though two batches share the stages
    q = res.requests
    assert (q.completion_time - q.first_token_time >= 4 * 1.0 - 1e-9).all()


def test_the_common_decode_step_also_keeps_the_cap():
    """vLLM's decode-all shortcut may not take more than max_num_seqs // stages either: with max_num_seqs=4 on two
    stages, arrivals at 0, 0, 1.1 and 2.0 bring three decoders back to the running list at once, and a batch still
    holds at most 2 (found by a review: the shortcut ran before the cut)."""
    req = make_instance([4, 4, 4, 4], [12, 12, 12, 12], [0.0, 0.0, 1.1, 2.0])
    for policy in (VLLM(max_num_seqs=4), Sarathi(chunk_size=64, max_num_seqs=4)):
        res = engine(req, policy, latency=LinearLatency(d0=1.0, d1=0.0, hop=0.5, hardware=HW2)).run()
        assert res.status == "completed" and res.iterations.batch_size.max() == 2, policy.name


def test_pipelining_halves_the_time_of_a_full_pipeline():
    """Eight requests decoding 40 tokens, a batch costing 0.125 s per token (d0 = 0): one stage decodes all eight in
    1 s per iteration; two stages of half the layers keep two batches of four in flight (max_num_seqs=8), each
    request getting a token every 0.5 s, so the makespan nearly halves."""
    req = make_instance([4] * 8, [40] * 8)
    one = engine(req, VLLM(max_num_seqs=8), hw=HardwareSpec("a100_tp2", "a100", "a100_pairwise_nvlink", 2),
                 latency=LinearLatency(d0=0.0, d1=0.125), capacity=512).run()
    two = engine(req, VLLM(max_num_seqs=8), latency=LinearLatency(d0=0.0, d1=0.125, hardware=HW2), capacity=512).run()
    m1, m2 = one.requests.completion_time.max(), two.requests.completion_time.max()
    assert m1 == pytest.approx(4.0 + 39 * 1.0)  # a prefill of 32 tokens, then 39 decodes of eight
    assert m2 < 0.6 * m1
    assert two.iterations.batch_size.max() == 4


def test_pipeline_needs_a_latency_model_of_stages_and_paged_memory():
    req = make_instance([4], [2])
    with pytest.raises(ConfigError, match="latency=unit times 1 pipeline stage"):
        engine(req, VLLM(), latency=UnitLatency())
    from kvstudy.memory import PaperMemory

    with pytest.raises(ConfigError, match="memory=paged"):
        engine(req, api.build_policy(api.compose(["+policy=mcsf"])), memory=PaperMemory(64))


POLICIES = api.options("policy")


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_runs_on_a_pipeline(name):
    """Every registered policy, on two stages: it finishes the conformance instances, never sees a request in flight
    (the Recorder's checks: blocks cover each running request's context, the running sums, a preempted request comes
    back with its tokens), KV within capacity, and no request gets two tokens closer than one whole batch time."""
    cfg = api.compose([f"+policy={name}"])
    prefix = bool(cfg.memory.get("prefix_caching"))  # the cache-aware policies run on vLLM's prefix cache
    if not getattr(api.build_policy(copy.deepcopy(cfg)), "preemptive", False):
        with pytest.raises(ConfigError, match="is admission-only .* which pipeline stages"):
            engine(make_instance([4], [2]), api.build_policy(copy.deepcopy(cfg)))
        return
    for seed in range(2):
        rng = np.random.default_rng(seed)
        n = 40
        req = make_instance(rng.integers(1, 8, n), rng.integers(1, 30, n), np.sort(rng.uniform(0, 20, n)))
        policy = api.build_policy(copy.deepcopy(cfg))
        if getattr(policy, "preemptive", False):  # the Recorder wraps step policies (an admission one is adapted)
            policy = Recorder(policy)
        memory = PagedMemory(80, block_size=4, watermark=0.0, swap_space_gb=4.0, decode_block_check="boundary",
                             prefix_caching=prefix)
        res = engine(req, policy, memory=memory, latency=LinearLatency(d0=1.0, d1=0.0, hop=0.25, hardware=HW2),
                     stall_limit=400).run()
        assert res.status == "completed", res.message
        assert (res.iterations["blocks_used"] <= 20).all()
        q = res.requests[res.requests.state == "done"]
        per_token = (q.completion_time - q.first_token_time) / np.maximum(q.output_tokens - 1, 1)
        assert (per_token[q.output_tokens > 1] >= 1.25 - 1e-9).all()  # d0 + hop: a whole batch
