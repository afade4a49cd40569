"""MC-SF (Alg. 1) and MC-Benchmark (Alg. 2) of Jaillet et al.

Both keep every running request and add the largest prefix of the ordered waiting queue for which
eq. (5) holds at all predicted completion times; they differ only in the order: shortest predicted
output first (MC-SF, eq. (6)) or arrival order (MC-Benchmark). Both stop at the first request that
fails the check ("Break the for loop" in both algorithms).

``admission``: ``paper`` (default) checks eq. (5) as the paper writes it; ``authors_code`` checks what the
authors' real-data scripts (``MC-SF.py``, ``MC-Benchmark.py``) check, with ``avg_batch_time`` standing for their
undefined ``average_batch_processing_time`` (``AuthorsCheck``; docs/authors_code.md).

On paged memory (``memory=paged``, through kvstudy/policies/admission.py) eq. (5) is checked in whole blocks with the
prefill iteration charged (``BlockFutureMemory``); ``admission=authors_code`` counts tokens as the scripts do and is
refused there.

``prefix_aware`` (kvstudy's extension for prefix caching, issue 36; not in the paper): eq. (5) with shared blocks
counted once. A block several running requests hold is charged to the one predicted to hold it longest (the
others' w drop by a block each), and a candidate is not charged the leading blocks of its prompt that running
requests hold and are predicted to hold at least as long as it runs (it shares them). Since a shared block stays in
memory while any holder runs, and the charged holder is the last to leave, memory at every check point is then
counted exactly for the running requests; a candidate's shared blocks held by requests predicted to leave before it
are charged in full. Cached blocks nobody uses are free memory (``running_kv_tokens`` counts blocks in use), so
eq. (5) treats them as reclaimable. Needs memory.prefix_caching=true (``+policy=mcsf_prefix``).
"""
from __future__ import annotations

import numpy as np

from kvstudy.config.validate import check_group
from kvstudy.policies.base import Policy, SchedulerView, fifo_order, shortest_predicted_order
from kvstudy.policies.memory_check import AuthorsCheck, BlockFutureMemory, FutureMemory, running_terms


class PrefixFutureMemoryPolicy(Policy):
    """Largest prefix of ``order`` satisfying eq. (5) against a budget of (1 - margin) * M.

    ``margin`` is 0 in Alg. 1/2; Sec. 5.2.2 plans with noisy predictions under alpha = 0.1.
    """

    def __init__(self, margin: float = 0.0, admission: str = "paper", avg_batch_time: float = 0.05,
                 prefix_aware: bool = False) -> None:
        # every value against its declaration in kvstudy/config/schema.py (MCSF and MCBenchmark take the same keys)
        check_group("policy", {"_target_": "kvstudy.policies.mcsf.MCSF", "margin": margin, "admission": admission,
                               "avg_batch_time": avg_batch_time, "prefix_aware": prefix_aware})
        self.margin = float(margin)
        self.admission, self.avg_batch_time = admission, float(avg_batch_time)
        self.prefix_aware = prefix_aware

    def reset(self, seed: int) -> None:
        super().reset(seed)
        self._kept = None  # eq. (5)'s check after the last walk, and what it needs to be reused (``_memory``)

    def _memory(self, view: SchedulerView, budget: int):
        """Eq. (5)'s check of the running requests, to which the walk adds candidates, and the context to keep it
        after the walk (None: not kept). On the paper's memory the check the last walk ended with (its admissions
        included) is kept and brought up to date instead of being rebuilt each iteration (issue 47): moved on by the
        rounds since (``FutureMemory.shifted``), and the requests that have left the running set since (finished,
        or admissions the engine did not start) taken out (``FutureMemory.remove``); both exact. On paged memory the
        check in blocks is kept the same way (``BlockFutureMemory.shifted`` / ``remove``, issue 59), and with
        ``prefix_aware`` only while the prefix cache's sharing is unchanged (``view.sharing_version()``: who is charged
        a shared block). It is rebuilt when the view's key changes (an eviction) or a running request is one the kept
        check never had."""
        signature = view.running_signature() if self.admission != "authors_code" else None
        if signature is None:
            return self._build_memory(view, budget), None
        key, rounds, members = signature
        if self.prefix_aware:  # who is charged a shared block changes only when its holders do (issue 59)
            key = (key, view.sharing_version())
        kept = getattr(self, "_kept", None)
        if kept is not None and kept[0] == key and kept[1] == budget:
            present = set(members)
            if present <= kept[4]:
                if view.block_size is None:
                    memory = kept[2].shifted(rounds - kept[3])
                else:  # paged memory: point 0 is this iteration's blocks, the engine's count
                    memory = kept[2].shifted(rounds - kept[3], view.running_kv_tokens // view.block_size)
                if not present.issuperset(memory.ids):  # some finished (or were not started): out of the check
                    memory.remove({i for i in memory.ids if i not in present})
                return memory, (key, budget, rounds, present)
        return self._build_memory(view, budget, ids=members), (key, budget, rounds, set(members))

    def _build_memory(self, view: SchedulerView, budget: int, ids=None):
        """Eq. (5)'s check of the running requests built afresh (``ids``: their names, for a check that is kept)."""
        w, d = running_terms(view)
        if self.prefix_aware:  # shared blocks charged to their longest-lived holder only
            w = w - view.block_size * view.duplicate_blocks(d)
        if view.block_size is not None:  # paged memory: eq. (5) in whole blocks, the prefill iteration charged
            return BlockFutureMemory(budget, w, d, view.block_size, view.running_kv_tokens // view.block_size, ids=ids)
        if self.admission == "authors_code":
            return AuthorsCheck(budget, w, d, float(view.time), self.avg_batch_time)
        return FutureMemory(budget, w, d, ids=ids)

    def admit(self, view: SchedulerView, order: np.ndarray) -> np.ndarray:
        """The general path (the reference ``schedule`` is tested against): the check built afresh."""
        budget = int(np.floor((1.0 - self.margin) * view.capacity))
        memory = self._build_memory(view, budget)
        prompts, predicted = view.waiting_prompt, view.waiting_predicted
        taken = 0
        for pos in order:
            prompt = int(prompts[pos]) - (view.shared_tokens(int(pos), int(predicted[pos])) if self.prefix_aware else 0)
            if not memory.try_add(prompt, int(predicted[pos])):
                break
            taken += 1
        return order[:taken]

    def schedule(self, view: SchedulerView) -> np.ndarray:
        """Same decision as ``admit(view, order(view))`` (a test pins this), computed without reading the whole
        queue: the view yields the waiting requests in this policy's order and the walk stops at the first that
        fails eq. (5), as Algs. 1 and 2 do, so an iteration costs the same at any queue length."""
        if view.num_waiting == 0:
            return np.empty(0, dtype=np.int64)
        budget = int(np.floor((1.0 - self.margin) * view.capacity))
        memory, keep = self._memory(view, budget)
        taken = []
        shared = view.shared_tokens if self.prefix_aware else None
        name = view.waiting_member if keep is not None else None
        for pos, prompt, predicted in view.ordered_waiting(self.waiting_order):
            if shared is not None:
                prompt -= shared(pos, predicted)
            if not (memory.try_add(prompt, predicted) if name is None else memory.try_add(prompt, predicted, name(pos))):
                break
            taken.append(pos)
        if keep is not None:  # the check as the walk left it: the running set with this step's admissions
            key, budget, rounds, running = keep  # who can run at the next step: these and the admitted
            running.update(memory.joined)
            self._kept = (key, budget, memory, rounds, running)
        return np.asarray(taken, dtype=np.int64)


class MCSF(PrefixFutureMemoryPolicy):
    """Memory-Constrained Shortest-First, Alg. 1 / eq. (6)."""

    name = "mcsf"
    waiting_order = "predicted"

    def order(self, view: SchedulerView) -> np.ndarray:
        return shortest_predicted_order(view)


class MCBenchmark(PrefixFutureMemoryPolicy):
    """Memory-Constrained Benchmark, Alg. 2: the eq. (5) check in arrival order."""

    name = "mc_benchmark"
    waiting_order = "arrival"

    def order(self, view: SchedulerView) -> np.ndarray:
        return fifo_order(view)
