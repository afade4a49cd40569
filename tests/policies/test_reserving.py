"""RLP and S3 as the CacheOPT paper ran them (issue 25): up-front demand, the outgrown request as the victim,
RLP's re-queue with the full context, S3's swap and doubling. Times count iterations (1 s each)."""
import numpy as np
import pytest

from kvstudy.memory import PagedMemory
from kvstudy.policies.reserving import RLP, S3
from kvstudy.engine.loop import StepEngine
from kvstudy.costs.swap_models import PcieSwap
from tests.conftest import make_instance
from tests.step_helpers import ARCH, HW, ONE_SECOND


def run(policy, prompt, output, predicted, capacity=1024, block_size=4):
    req = make_instance(np.array(prompt), np.array(output))
    policy.reset(0)
    memory = PagedMemory(capacity, block_size=block_size, watermark=0.0)
    return StepEngine(req, np.array(predicted), policy, ONE_SECOND, memory, PcieSwap(), ARCH, HW).run()


def test_s3_swaps_an_outgrown_request_and_doubles_its_demand():
    # predicted 40 -> bucket [0, 50): 50 output tokens held (prompt 10 + 50 = 60 tokens, 15 blocks of 4).
    # True output 130: it outgrows 60 tokens of context, is swapped out, comes back with 100, outgrows 110, comes
    # back with 200 and finishes: two preemptions, both swaps.
    res = run(S3(), [10], [130], [40])
    r = res.requests.iloc[0]
    assert res.status == "completed" and r["state"] == "done"
    assert r["preemptions"] == 2 and r["restarts"] == 0
    assert r["preemptions_swap"] == 2 and r["preemptions_recompute"] == 0
    # the blocks held: 60 tokens, then 110, then 210 (the doubled demands), reported as used blocks
    held = sorted(set(res.iterations["blocks_used"].tolist()) - {0})
    assert held == [15, 28, 53]


def test_rlp_requeues_an_outgrown_request_and_reruns_it_with_the_full_context():
    # predicted 20 + 100 padding: 130 tokens held; true output 200 outgrows them once; recompute, re-queue, and the
    # re-run holds the whole context (4,096 for Llama2-70B) and finishes
    res = run(RLP(), [10], [200], [20], capacity=8192)
    r = res.requests.iloc[0]
    assert res.status == "completed" and r["preemptions"] == 1 and r["restarts"] == 1
    assert r["preemptions_recompute"] == 1 and r["recomputed_tokens"] > 0
    held = sorted(set(res.iterations["blocks_used"].tolist()) - {0})
    assert held == [130 // 4 + 1, 4096 // 4]  # 130 tokens, then the whole context


def test_demands_are_held_up_front_and_block_admission():
    # two requests predicted exactly: RLP holds prompt + output + 100 each; with room for one, the second waits
    res = run(RLP(), [20, 20], [10, 10], [10, 10], capacity=(20 + 10 + 100) * 1 + 8, block_size=1)
    assert res.status == "completed"
    first = res.requests.sort_values("request_id")
    assert first["first_token_time"].iloc[1] >= first["completion_time"].iloc[0]  # it waited for the first's KV
    assert (res.requests["preemptions"] == 0).all()


@pytest.mark.parametrize("cls", [RLP, S3])
def test_exact_predictions_never_preempt(cls):
    rng = np.random.default_rng(0)
    prompt, output = rng.integers(1, 40, 60), rng.integers(1, 60, 60)
    res = run(cls(), prompt, output, output, capacity=2048)
    assert res.status == "completed" and (res.requests["preemptions"] == 0).all()

