"""memory.decode_block_check: when a running request may decode (issue 33, item 9).

vLLM 0.6's block manager lets a running request decode only if a GPU block is free at its turn
(``can_append_slots`` counts its current block as touched even when the new token fits in it), and Vidur's vLLM
replica scheduler asks the same ("vllm requires at least one block to be available"); ``vllm`` is that rule.
``vllm`` is the default (issue 33); ``boundary`` (kvstudy's default before it) asks for a free block only when a
decode crosses a block boundary.
"""
import numpy as np
import pytest

from kvstudy import api
from kvstudy.errors import ConfigError
from kvstudy.latency.models import UnitLatency
from kvstudy.memory import PagedMemory
from kvstudy.policies.rr_sjf import QueuedVLLM
from kvstudy.policies.vllm import VLLM, Sarathi
from tests.conftest import make_instance
from tests.step_helpers import step_engine


@pytest.mark.parametrize("policy", [QueuedVLLM, VLLM], ids=["fcfs", "vllm"])
def test_the_two_rules_by_hand(policy):
    # 2 blocks of 2 tokens; A (arrival 0, prompt 1, output 2), B (arrival 1, prompt 1, output 2), unit time.
    # t=0 A's prefill (1 block, first token); t=1 B's prefill (the second block; no decode in a prefill step);
    # t=2 A and B decode their second token within their own blocks: `boundary` lets both, done at 3. Under `vllm`
    # A's turn needs a free block and none is: B (the back of the running list) is preempted; A is done at 3, B
    # recomputes and is done at 4 (the instance of issue 33, item 9).
    times = {}
    for rule in ("boundary", "vllm"):
        req = make_instance([1, 1], [2, 2], arrival=np.array([0.0, 1.0]))
        res = step_engine(req, policy(), capacity=4, block_size=2, latency=UnitLatency(), decode_block_check=rule).run()
        times[rule] = (res.requests.completion_time.tolist(), res.requests.preemptions.tolist())
    assert times["boundary"] == ([3.0, 3.0], [0, 0])
    assert times["vllm"] == ([3.0, 4.0], [0, 1])


def test_sarathi_follows_the_rule_too():
    # both arrive at 0 and prefill together (both blocks taken); at t=1 both decode within their blocks: `boundary`
    # lets them (done at 2), `vllm` finds no free block at A's turn and preempts B
    out = {}
    for rule in ("boundary", "vllm"):
        req = make_instance([1, 1], [2, 2])
        res = step_engine(req, Sarathi(chunk_size=8), capacity=4, block_size=2, latency=UnitLatency(),
                          decode_block_check=rule).run()
        out[rule] = (res.requests.completion_time.tolist(), res.requests.preemptions.tolist())
    assert out["boundary"] == ([2.0, 2.0], [0, 0])
    assert out["vllm"][1] == [0, 1] and out["vllm"][0][0] == 2.0 and out["vllm"][0][1] > 2.0


def test_no_preemption_when_a_block_stays_free():
    # three blocks: the spare block lets every decode's turn see one free
    req = make_instance([1, 1], [2, 2], arrival=np.array([0.0, 1.0]))
    res = step_engine(req, VLLM(), capacity=6, block_size=2, latency=UnitLatency(), decode_block_check="vllm").run()
    assert res.requests.preemptions.tolist() == [0, 0]


def test_the_setting_is_checked_and_composes():
    with pytest.raises(ConfigError, match="memory.decode_block_check='always'"):
        PagedMemory(64, block_size=4, decode_block_check="always")
    cfg = api.compose(["+policy=vllm", "memory.decode_block_check=vllm"])
    assert cfg.memory.decode_block_check == "vllm"
    assert api.compose(["+policy=vllm"]).memory.decode_block_check == "vllm"
    assert PagedMemory(64, block_size=4).decode_block_check == "vllm"
