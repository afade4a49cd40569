"""The run's state: one object holding every request's fields and the queues, which the engine's phases change and the
records (records.py), the policy's view (kvstudy/policies/step.py ``StepView``) and the cluster driver
(kvstudy/cluster/driver.py) read.

Per-request fields are parallel Python lists indexed by the request's position in the run (0..n-1, arrival order):
a list index is the fastest read and write Python has, and the loop touches a few of them per request per event.
Times are seconds on the run's clock (NaN: not yet); token counts are in the memory model's convention
(``RunState.output``: o tokens under vLLM's convention, o + 1 under the MC-SF paper's, whose o decode rounds follow
the prompt's round).
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

from kvstudy.engine.decode_clock import DecodeClock
from kvstudy.engine.states import FUTURE


class GeneratedTokens:
    """``view.generated[i]``: tokens request i has produced, read through the decode clock."""

    def __init__(self, clock: DecodeClock) -> None:
        self._clock = clock

    def __getitem__(self, i: int) -> int:
        return self._clock.generated(i)


class WaitingSet(dict):
    """The waiting requests as a set (a dict of None), for a policy that keeps its own queue orders (the admission
    adapter, kvstudy/policies/admission.py; a step policy with ``own_queue_order``): removing a request from anywhere
    costs O(1), not a deque's O(position), and returning victims costs O(victims). Its order is never read."""

    def append(self, i: int) -> None:
        self[i] = None

    def remove(self, i: int) -> None:
        del self[i]

    def extendleft(self, items) -> None:
        self.update(dict.fromkeys(items))


def shared_list(requests, array: np.ndarray) -> list:
    """``array.tolist()``, made once per array of a request set and kept on it (``requests._lists``, with the array,
    so its id is not reused): every replica's run state reads the same list. Callers never change it."""
    lists = requests.__dict__.setdefault("_lists", {})
    kept = lists.get(id(array))
    if kept is None or kept[0] is not array:
        kept = lists[id(array)] = (array, array.tolist())
    return kept[1]


class RunState:
    """Everything a run changes, named for what it holds. Built once per run by the engine (``StepEngine.loop``)."""

    def __init__(self, requests, predicted: np.ndarray, paper: bool, block_size: int, held: dict,
                 own_queue_orders: bool, shared: dict = None) -> None:
        """``shared``: the per-request lists of the replicas of one cluster (kvstudy/cluster/driver.py ``drive``), by
        name: a replica writes a request's entries only once the request is routed to it, so one list per field serves
        them all and a cluster's state grows with the trace once, not once per replica (issue 59 item 5). What a
        replica writes for requests it does not own (its up-front rejections, ``reject_reason``; ``request_state``) stays
        its own. None: every list is this run's."""
        n = self.n = len(requests)

        def kept(name: str, make) -> list:  # the cluster's list of that name (made once), or a list of this run's
            if shared is None:
                return make()
            if name not in shared:
                shared[name] = make()
            return shared[name]

        def per_request(name: str, value) -> list:
            return kept(name, lambda: [value] * n)

        self.requests = requests
        # --- the requests, as the loop reads them (lists: fast single-element access) ---
        # read-only lists, made once per request set: the replicas of a cluster share them (issue 59)
        self.prompt = s = shared_list(requests, requests.prompt_tokens)
        #: output tokens in the memory model's convention (paper: o + 1, the prompt's round produces one)
        self.output = [x + 1 for x in requests.output_tokens.tolist()] if paper else shared_list(
            requests, requests.output_tokens)
        self.arrival = shared_list(requests, requests.arrival_time)
        self.predicted_array = np.asarray(predicted, dtype=np.int64)
        self.predicted = shared_list(requests, self.predicted_array)
        self.request_id = shared_list(requests, requests.request_id)
        # --- where each request is ---
        #: per request its state code (kvstudy/engine/states.py: FUTURE, WAITING, RUNNING, DONE, REJECTED, SWAPPED,
        #: ELSEWHERE); a numpy array, so records and the driver select by state in one call
        self.request_state = np.full(n, FUTURE, dtype=np.int8)
        #: waiting requests in queue order (vLLM puts recompute victims at the front); a set when the policy keeps its
        #: own queue orders (an admission policy through the adapter)
        self.waiting = WaitingSet() if own_queue_orders else deque()
        self.running: list = []  # requests holding GPU KV, in admission order
        self.swapped = deque()  # requests whose KV is on the host
        self.prefilling: set = set()  # running requests whose prefill is unfinished
        self.growing: set = set()  # running requests that need one more block to decode in this iteration
        #: pipeline parallelism (kvstudy/engine/pipeline.py): running requests in a batch still in flight, off
        #: ``running`` (and ``prefilling``, the decode clock and the aggregates below) until it ends
        self.in_flight: set = set()
        self.reserved: set = set()  # requests holding blocks beyond their context (a reservation or a loan)
        # --- progress ---
        #: tokens produced (exact off the clock), the clock's ticks, the requests on it (decode_clock.py)
        self.last_token = per_request("last_token", math.nan)
        self.max_gap = per_request("max_gap", 0.0)  # each request's largest gap between tokens, seconds
        self.clock = DecodeClock(n, s, self.output, block_size, held, self.last_token, self.max_gap, gaps=not paper,
                                 per_request=per_request)
        self.generated = GeneratedTokens(self.clock)
        self.prefilled = per_request("prefilled", 0)  # tokens of the current prefill done
        #: prompt + generated when the current prefill started
        self.prefill_target = kept("prefill_target", lambda: list(s))
        #: the furthest each request's prefill has got in any life: a chunk beyond it is progress (engine.stall_limit
        #: counts iterations without a token, but a prompt longer than stall_limit chunks takes more than that)
        self.furthest_prefilled = per_request("furthest_prefilled", 0)
        # --- times, seconds ---
        self.first_scheduled = per_request("first_scheduled", math.nan)
        self.first_token = per_request("first_token", math.nan)
        self.completion = per_request("completion", math.nan)
        self.off_clock_gaps: list = []  # gaps between tokens produced off the decode clock (pooled TBT)
        self.preempted_at = per_request("preempted_at", math.nan)  # when the current preemption began (NaN: running or never)
        self.preempted_seconds = per_request("preempted_seconds", 0.0)
        # --- preemptions ---
        self.preemptions_recompute = per_request("preemptions_recompute", 0)
        self.preemptions_swap = per_request("preemptions_swap", 0)
        self.swap_fallbacks = per_request("swap_fallbacks", 0)  # swaps carried out as recomputes (no host room)
        self.recomputed_tokens = per_request("recomputed_tokens", 0)
        self.swapped_bytes = per_request("swapped_bytes", 0)
        self.reject_reason = [""] * n
        # --- prefix caching: prompt tokens served from the cache at the first prefill / at later ones ---
        self.prefix_cached_first = per_request("prefix_cached_first", 0)
        self.prefix_cached_later = per_request("prefix_cached_later", 0)
        # --- the MC-SF paper's records (records.py): the admission round and its stamp of the life that completes a
        #     request (an overflow round moves its survivors' schedules one round later), and its last round ---
        self.admission_round = per_request("admission_round", -1)
        self.admission_stamp = per_request("admission_stamp", math.nan)
        self.last_round = per_request("last_round", -1)
        # --- aggregates the loop keeps instead of summing over the running requests each iteration ---
        #: sum of prompt + generated - 1 (the cached context) over running requests past their prefill
        self.decode_context_tokens = 0
        #: sum of the prompts of the same requests (decode_context_tokens + their count - this: their tokens)
        self.decode_prompt_tokens = 0
        #: KV tokens of running requests still in their prefill
        self.prefill_kv_tokens = 0
        #: the next request (in arrival order) not yet joined or skipped
        self.next_arrival = 0
        #: in a cluster, (end, outstanding, KV in use) of the iteration in flight when it finishes requests: what a
        #: router sees before that end (kvstudy/cluster/driver.py ReplicaView)
        self.inflight = None
        # --- prefill/decode disaggregation (kvstudy/cluster/disaggregated.py); empty otherwise ---
        #: events the driver posts for a time on this replica's clock, a heap of (time, seq, kind, request, payload):
        #: ``arrive`` (a handed-off request joins the waiting queue), ``release`` (a held request's blocks are freed)
        self.inbox: list = []
        #: request -> prompt tokens whose KV another replica hands over when its prefill starts here
        self.supplied: dict = {}
        #: requests whose finish keeps their blocks (a prefill replica's, until the transfer ends), or None
        self.hold = None
        #: (stamp, request) of requests that finished holding their blocks, for the driver to hand off
        self.handed: list = []
        #: requests that joined the waiting queue since the policy's last step other than by arriving (handed off
        #: to this replica) and below ``policy_arrived``: the policy's view shows them (``StepView.joined``)
        self.joined: list = []
        #: ``num_arrived`` at the policy's last step: the arrivals it takes in next start there (a handed-off request
        #: at or past it is among them, so it is not listed in ``joined`` as well)
        self.policy_arrived = 0

    def outstanding(self) -> int:
        """Requests waiting, running (in flight too) or swapped out."""
        return len(self.waiting) + len(self.running) + len(self.swapped) + len(self.in_flight)

    def ids(self, indices, most: int = 8) -> str:
        """Request ids for a message: ``request(s) 3, 17, 21``, ``none``, or the first ``most`` and how many more."""
        ids = [self.request_id[i] for i in indices]
        if not ids:
            return "none"
        more = f" and {len(ids) - most} more" if len(ids) > most else ""
        return f"request(s) {', '.join(map(str, ids[:most]))}{more}"
