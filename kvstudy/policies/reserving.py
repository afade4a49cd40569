"""RLP and S3 as the CacheOPT paper ran them (Shen et al., Sec. 2.1, 2.4, 5; spec B3): allocate a request's whole
predicted KV demand up front, and preempt a request that outgrows it.

* ``rlp`` (Zheng et al., NeurIPS'23, "Response Length Perception"): the demand is prompt + predicted output
  + 100 tokens of padding. A request that exhausts it is preempted with recompute and re-queued. When it runs
  again, it gets the full context (the original code's failure re-run, "FCR", re-runs a failed request with the
  maximum length).
* ``s3`` (Jin et al., "S3"): the demand is prompt + the upper bound of the predicted output's 50-token bucket. A
  request that exhausts it is preempted with swap, and its output demand doubles for the next allocation.

Both admit in queue order (FCFS, vLLM's queue: recompute victims at its front) while the KV cache can hold the
whole demand above vLLM's watermark, within ``max_num_batched_tokens`` and ``max_num_seqs``. Swapped requests come
back, with their new demand, before any new admission (vLLM V0). Not modelled yet: RLP's grouping of requests with
similar predicted lengths into one batch (its variable batch size table). The demand never exceeds the model's
context. The engine holds the blocks (``Decision.reserve``) and reports them as reserved.
"""
from __future__ import annotations

from typing import Dict, Optional

from kvstudy.config.validate import check_group
from kvstudy.memory.base import LATER, NEVER
from kvstudy.policies.step import RECOMPUTE, SWAP, Decision, StepView
from kvstudy.policies.vllm import VLLM, _Plan


class ReservingPolicy(VLLM):
    """Up-front allocation of a predicted demand; a request that outgrows it is the victim (RLP, S3)."""

    #: preemption mode of an outgrown request
    mode = RECOMPUTE

    def reset(self, seed: int) -> None:
        super().reset(seed)
        self._demand: Dict[int, int] = {}  # output tokens to reserve for, per request (grows after a preemption)

    def first_demand(self, predicted: int) -> int:
        raise NotImplementedError

    def next_demand(self, view: StepView, i: int) -> int:
        raise NotImplementedError

    def demand(self, view: StepView, i: int) -> int:
        if i not in self._demand:
            self._demand[i] = self.first_demand(view.predicted[i])
        return self._demand[i]

    def reserve_tokens(self, view: StepView, i: int) -> int:
        """KV tokens to hold for request i: prompt + demand, within the context and the cache (above the
        watermark: a demand larger than the whole cache holds all of it), at least its context + 1."""
        mem = view.memory
        room = (mem.num_blocks - mem.watermark_blocks) * mem.block_size
        context = view.prompt[i] + view.waiting_generated[i]
        return max(context + 1, min(view.max_model_len, room, view.prompt[i] + self.demand(view, i)))

    def step(self, view: StepView) -> Decision:
        plan = _Plan(view)
        budget = self.token_budget(view)
        mem = view.memory
        # 1. a running request that needs a block beyond what it holds has outgrown its demand: it is the victim
        #    (in running order; ``growing`` holds the requests that need a block to decode now)
        if view.growing:
            for i in [i for i in view.running if i in view.growing and view.decode_blocks_needed(i) > 0
                      and not view.in_prefill(i)]:
                plan.d.preempt.append((i, self.mode))
                plan.free += mem.freed_by(i)  # with prefix caching: not the blocks it shares
                plan.num_seqs -= 1
                self._demand[i] = self.next_demand(view, i)
        decoding = len(view.running) - len(view.prefilling) - len(plan.d.preempt)  # victims are never in prefill
        plan.tokens += decoding
        plan.d.decode_all = decoding > 0
        # 2. swapped requests come back first, each with its (new) demand held
        for i in view.swapped:
            if plan.num_seqs + 1 > self.max_num_seqs or plan.tokens + 1 > budget:
                break
            tokens = self.reserve_tokens(view, i)
            back = mem.swap_in_blocks(i, view.prompt[i] + view.waiting_generated[i])
            extra = max(0, mem.blocks(tokens) - back)
            status = mem.can_swap_in(i, free=plan.free - extra)
            if status == NEVER:
                continue
            if status == LATER:
                break
            plan.free -= back + extra
            plan.num_seqs += 1
            plan.tokens += 1
            plan.d.swap_in.append(i)
            plan.d.reserve[i] = tokens
            if not plan.d.decode_all:
                plan.d.decode.append(i)
        if len(plan.d.swap_in) < len(view.swapped):
            return plan.d
        # 3. new (and recompute-victim) requests in queue order, each with its whole demand
        for i in view.waiting:
            if plan.num_seqs + 1 > self.max_num_seqs:
                break
            tokens = self.reserve_tokens(view, i)
            blocks = mem.blocks(tokens)
            status = mem.can_allocate(blocks, free=plan.free)
            if status == NEVER:
                continue  # can never be held: skipped (the engine rejects a request whose context alone cannot fit)
            if status == LATER:
                break
            chunk = view.prompt[i] + view.waiting_generated[i]
            if plan.tokens + chunk > budget:
                break
            plan.start_prefill(i, blocks, chunk)
            plan.d.reserve[i] = tokens
        return plan.d


class RLP(ReservingPolicy):
    name = "rlp"
    mode = RECOMPUTE

    def __init__(self, padding: int = 100, max_num_seqs: int = 256, max_num_batched_tokens: Optional[int] = None,
                 name: str = "rlp") -> None:
        # its own key against kvstudy/config/schema.py; VLLM checks the rest
        check_group("policy", {"_target_": "kvstudy.policies.reserving.RLP", "padding": padding})
        super().__init__(preemption_mode=RECOMPUTE, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, name=name)
        self.padding = padding

    def first_demand(self, predicted: int) -> int:
        return predicted + self.padding

    def next_demand(self, view: StepView, i: int) -> int:
        return view.max_model_len  # the failure re-run takes the full context (RLP's FCR)


class S3(ReservingPolicy):
    name = "s3"
    mode = SWAP

    def __init__(self, bucket: int = 50, max_num_seqs: int = 256, max_num_batched_tokens: Optional[int] = None,
                 name: str = "s3") -> None:
        # its own key against kvstudy/config/schema.py; VLLM checks the rest
        check_group("policy", {"_target_": "kvstudy.policies.reserving.S3", "bucket": bucket})
        super().__init__(preemption_mode=SWAP, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, name=name)
        self.bucket = bucket

    def first_demand(self, predicted: int) -> int:
        return (predicted // self.bucket + 1) * self.bucket  # the upper bound of the predicted bucket

    def next_demand(self, view: StepView, i: int) -> int:
        return 2 * self.demand(view, i)  # S3 doubles the demand of a request that overran it
