"""The state transitions (kvstudy/engine/transitions.py) on a hand-built run state and memory, without an engine
(issue 56): each keeps the run's state, the memory and the decode clock in agreement, and returns what it moved."""
import math

import numpy as np

from kvstudy.engine.events import EventLog
from kvstudy.engine.state import RunState
from kvstudy.engine.states import DONE, REJECTED, RUNNING, SWAPPED, WAITING
from kvstudy.engine.transitions import Transitions
from kvstudy.memory import PagedMemory
from kvstudy.policies.step import RECOMPUTE, SWAP
from tests.conftest import make_instance

BLOCK_BYTES = 1000  # one block's bytes over every GPU


def setup(prompts, outputs, capacity=32, swap_gb=1.0, events=False, watermark=0.0):
    """Requests waiting, a paged memory of blocks of 4 tokens (host space of ``swap_gb`` GiB at 250 bytes per token
    per GPU), and the transitions over them."""
    req = make_instance(prompts, outputs)
    mem = PagedMemory(capacity, block_size=4, watermark=watermark, swap_space_gb=swap_gb)
    mem.bind(250)
    st = RunState(req, req.output_tokens, paper=False, block_size=4, held=mem.gpu, own_queue_orders=False)
    for i in range(st.n):
        st.request_state[i] = WAITING
        st.waiting.append(i)
    return st, mem, Transitions(st, mem, EventLog() if events else None, block_bytes=BLOCK_BYTES)


def decoding(st, act, i, t=0.0):
    """Request i prefilled whole and decoding from its first token (as the engine's stamp does)."""
    act.start_prefill(i, t)
    st.prefilling.discard(i)
    st.prefill_kv_tokens -= st.prefilled[i]
    st.prefilled[i] = st.prefill_target[i]
    st.clock.tokens[i] = 1
    st.decode_context_tokens += st.prompt[i]
    st.decode_prompt_tokens += st.prompt[i]
    st.clock.start(i, 1)


def test_start_prefill_takes_the_blocks_and_moves_the_request_to_running():
    st, mem, act = setup([6, 4], [3, 3])
    act.start_prefill(1, 2.5)
    assert st.request_state[1] == RUNNING and st.running == [1] and list(st.waiting) == [0]
    assert mem.held(1) == 1 and mem.used == 1 and st.prefill_target[1] == 4 and st.prefilling == {1}
    assert st.first_scheduled[1] == 2.5


def test_a_swap_moves_the_blocks_to_the_host_and_returns_them():
    """A (prompt 6) decodes with 6 tokens of context held in 2 blocks: swapped out, 2 blocks go to the host (2,000
    bytes counted), its context leaves the decode aggregates; swapped back in, the same blocks return."""
    st, mem, act = setup([6, 4], [3, 3])
    decoding(st, act, 0)
    done, blocks = act.preempt(0, SWAP, 1.0)
    assert (done, blocks) == (SWAP, 2)
    assert st.request_state[0] == SWAPPED and list(st.swapped) == [0] and st.running == []
    assert mem.used == 0 and mem.host_used == 2 and st.swapped_bytes[0] == 2 * BLOCK_BYTES
    assert st.decode_context_tokens == 0 and st.decode_prompt_tokens == 0 and st.preemptions_swap[0] == 1
    assert act.swap_in(0, 3.0) == 2
    assert st.request_state[0] == RUNNING and mem.used == 2 and mem.host_used == 0
    assert st.preempted_seconds[0] == 2.0 and math.isnan(st.preempted_at[0])
    assert st.decode_context_tokens == 6 and st.swapped_bytes[0] == 4 * BLOCK_BYTES


def test_a_swap_without_host_room_is_a_recompute():
    """No host space: the swap asked for is carried out as a recompute, counted as a fallback; the request waits to
    prefill its prompt and the token it made (7 tokens), its 6 tokens of KV dropped."""
    st, mem, act = setup([6, 4], [3, 3], swap_gb=0.0)
    decoding(st, act, 0)
    assert act.preempt(0, SWAP, 1.0) == (RECOMPUTE, 0)
    assert st.request_state[0] == WAITING and st.swap_fallbacks[0] == 1 and st.preemptions_recompute[0] == 1
    assert st.recomputed_tokens[0] == 6 and st.prefill_target[0] == 7 and mem.used == 0


def test_a_recompute_that_can_never_fit_again_is_rejected():
    """8 blocks of 4; A has prompt 28 and has made 5 tokens: its recompute needs 32 + 1 = 33 tokens, 9 blocks > 8."""
    st, mem, act = setup([28], [10], capacity=32, events=True)
    decoding(st, act, 0)
    st.clock.stop(0)
    st.clock.tokens[0] = 5
    st.clock.start(0, 5)
    assert act.preempt(0, RECOMPUTE, 1.0) == (RECOMPUTE, 0)
    assert st.request_state[0] == REJECTED and "needs 9 blocks" in st.reject_reason[0]
    events, _ = act.events.tables(st.requests.request_id)
    assert events[["kind", "mode", "tokens"]].values.tolist()[-2:] == [["preempt", "recompute", 32], ["reject", "", 0]]


def test_the_rejection_says_what_the_watermark_leaves():
    """8 blocks of 4 with a watermark of 25% (2 blocks): A (prompt 20) has made 5 tokens; its recompute of 25 tokens
    needs 7 blocks, and 8 - 7 < 2: never. The reason names the 7 blocks and the 8 - 2 = 6 the watermark leaves."""
    st, mem, act = setup([20], [10], capacity=32, watermark=0.25)
    decoding(st, act, 0)
    st.clock.stop(0)
    st.clock.tokens[0] = 5
    st.clock.start(0, 5)
    act.preempt(0, RECOMPUTE, 1.0)
    assert st.request_state[0] == REJECTED
    assert st.reject_reason[0] == ("recompute after preemption needs 7 blocks for prompt + generated = 25 tokens; "
                                   "the watermark leaves 6")


def test_finish_frees_the_blocks_and_stamps_the_completion():
    st, mem, act = setup([6, 4, 4, 4, 4, 4], [3, 3, 3, 3, 3, 3], capacity=64)
    for i in range(6):
        decoding(st, act, i)
        st.clock.stop(i)
    act.finish([0, 2], 4.0, 7)
    assert [int(st.request_state[i]) for i in (0, 2)] == [DONE, DONE] and st.running == [1, 3, 4, 5]
    assert st.completion[0] == 4.0 and st.last_round[2] == 7 and mem.used == 4 and mem.held(0) == 0
    act.finish([1, 3, 4, 5], 5.0, 8)  # more than four leave in one pass: the order of the rest kept (none here)
    assert st.running == [] and mem.used == 0 and (st.request_state == DONE).all()


def test_a_token_off_the_clock_counts_its_gap():
    st, _, act = setup([4], [3])
    act.token(0, 1.0)
    act.token(0, 3.5)
    assert st.first_token[0] == 1.0 and st.last_token[0] == 3.5 and st.max_gap[0] == 2.5
    assert st.off_clock_gaps == [2.5]
    assert np.isnan(st.completion[0])


def test_replicas_share_the_read_only_request_lists():
    """Two run states over one request set (two replicas) read the same prompt, arrival, predicted and id lists
    (issue 59: made once), equal to the arrays; a new prediction array gets its own list."""
    req = make_instance([3, 5, 7], [2, 4, 6])
    a = RunState(req, req.output_tokens, paper=False, block_size=4, held={}, own_queue_orders=False)
    b = RunState(req, req.output_tokens, paper=False, block_size=4, held={}, own_queue_orders=False)
    for name in ("prompt", "output", "arrival", "predicted", "request_id"):
        assert getattr(a, name) is getattr(b, name)
    assert a.prompt == [3, 5, 7] and a.predicted == [2, 4, 6] and a.arrival == req.arrival_time.tolist()
    c = RunState(req, np.array([9, 9, 9]), paper=False, block_size=4, held={}, own_queue_orders=False)
    assert c.predicted == [9, 9, 9] and a.predicted == [2, 4, 6]
    assert RunState(req, req.output_tokens, paper=True, block_size=0, held={}, own_queue_orders=False).output == [3, 5, 7]
