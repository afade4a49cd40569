"""CacheOPT (Shen et al.; spec B2, B9) as a step policy on ``memory=paged``, every component a switch.

One round per iteration (B9, assembling Sec. 3.3-3.5):

1. **Estimate** (Sec. 3.2, eqs. 1-4; ``padding``): on arrival, s_o = X^ +/- t with t = k(c) (b - a) for the
   request's 50-token bin of X^ and its direction (kvstudy/cacheopt/padding.py); c fixed (0.9) or eq. (4) from the arrival
   rate measured over ``rate_window`` seconds. ``padding=fixed`` is the /CKA ablation (s_o = 1.1 X^).
   M_i = s_p + s_o, at most the context.
2. **Slack** (Table 2, step 1): RT = SLO_tft - (now - arrival) for a request that has not produced a token, else
   SLO_tbt - (now - its last token). T_I^max is the longest iteration so far (the engine's iteration times:
   idle time before an arrival is not an iteration). A request is *critical* when it "must run next to meet" its
   SLO. For a running request that used up its allocation (N_r) that is RT_tbt - T_I^max < epsilon, as printed.
   The critical waiting requests N_w are, as Sec. 3.3 defines them, *new* requests racing their TTFT SLO:
   "the waiting requests that have (RT_tft - T_I^max) < epsilon"; preempted requests in the queue are ordered by
   RT_tbt but are not in N_w (``critical_waiting: first_token``). ``critical_waiting: any`` is kvstudy's reading
   before issue 33 (every waiting or swapped request by its slack; ``+policy=cacheopt_critical_any``): under load
   a preempted request is then critical at once and preempts another in turn. Either way a waiting request whose
   SLO is already missed (RT < 0) cannot be saved by running next, so it is not critical [D] (it still leads the
   RT order): 0 <= RT < T_I^max + epsilon.
3. **Critical requests** (steps 3-7), served first: a running request that has used up its allocation
   ("returned") gets one block, from the pool, else the global reserve, else by preemption; a waiting one is
   embedded into a running host's unused allocation if one fits (Sec. 3.3.1, best fit, buffer b), else it gets
   s_p + B from the pool, preempting if it must (and if preemption can free enough).
4. **Non-critical requests** (steps 8-10): returned requests that did not get a block, running requests predicted
   to exhaust their allocation within ``m`` iterations (proactive allocation, Sec. 3.3.3), and waiting requests in
   RT order while the token budget lasts (embedded first). The pool (free blocks minus the reserve) is shared by
   kvstudy/cacheopt/allocation.py (Sum M = A', < A', > A'). A request whose allocation was cut is *linked* to a
   running request r_j that releases at least the shortfall before r_i exhausts its allocation (step 10,
   :meth:`CacheOPT._link`); when r_j leaves the GPU, r_i takes those blocks first in the next step (``link``).
   A returned request left without a block stalls this iteration, keeping its KV (spec B8.15).
5. **Preemption** (Sec. 3.4, ``preemption``): victims in the bucketed order of kvstudy/cacheopt/preemption.py
   (loosest TBT SLO, most remaining work, least KV) or FCFS (the latest admitted first, /PP). A host whose growth
   reaches its guest's region and finds no free block preempts the guest (the conflict rule).
   **Strategy** (Sec. 3.5, ``strategy``): ``select`` swaps a victim whose context exceeds the sweet spot of the
   fitted regressors (kvstudy/costs/preemption_cost.py), or with no crossing the cheaper one at its length; ``recompute``
   always recomputes (/PSS); a request in prefill is always recomputed.
6. **Batch**: every running request past its prefill decodes (one token of the budget each) unless it stalls;
   unfinished chunked prefills continue; then admissions with chunks, critical first; all under ``token_budget``
   (spec B8.13: 512, Sarathi's) and ``max_num_seqs``.

``preempt_for_waiting=false`` [D, not in the paper] keeps step 6 from preempting running requests for a critical
*waiting* one (it then waits for free KV like the others); it isolates the churn that step causes under overload.

``selection=fcfs`` with ``padding=rlp`` is the /RSA ablation (FCFS selection, RLP's prediction + 100 allocation).
``proactive=false`` is /PA, ``reserve_blocks=0`` /GR, ``link=false`` drops step 10's link (a cut request then
draws from free KV and the reserve when it runs out). Not modelled: the SLO-checked additions of case Sum M < A'
beyond the token budget (B8.14: the budget caps them).

The run supplies, through :meth:`before_run` and :meth:`prepare` (kvstudy/cacheopt/setup.py): per-request SLOs (kvstudy/cacheopt/slo.py), the
error ranges (b - a) from a calibration split, and the fitted swap/recompute costs.
"""
from __future__ import annotations

import bisect
from itertools import chain
from typing import Dict, List, Optional

from kvstudy.cacheopt.allocation import allocate
from kvstudy.cacheopt.preemption import choose_mode, victim_order
from kvstudy.cacheopt.queue import DeadlineQueue
from kvstudy.policies.request_states import DONE, ELSEWHERE, IN_FLIGHT, RUNNING, SWAPPED, WAITING
from kvstudy.config.validate import check_group
from kvstudy.errors import ConfigError
from kvstudy.cacheopt.padding import adaptive_confidence, padded_output
from kvstudy.policies.step import RECOMPUTE, SWAP, Decision, StepPolicy, StepView


class CacheOPT(StepPolicy):
    name = "cacheopt"

    def __init__(self, token_budget: int = 512, padding: str = "confidence", confidence: float = 0.9,
                 adaptive: bool = False, alpha: float = 0.9, beta: float = 0.01, rate_window: float = 60.0,
                 subtract_over: bool = True, fixed_fraction: float = 0.1, rlp_padding: int = 100,
                 selection: str = "slo", embedding: bool = True, buffer: int = 8, allocation: str = "rationale",
                 proactive: bool = True, m: int = 2, reserve_blocks: int = 8, preemption: str = "bucketed",
                 strategy: str = "select", epsilon: float = 0.001, max_num_seqs: int = 256,
                 preempt_for_waiting: bool = True, critical_waiting: str = "first_token", link: bool = True,
                 direction_accuracy: float = 0.85, calibration_requests: int = 6000, slo: Optional[dict] = None,
                 name: str = "cacheopt") -> None:
        # every value against its declaration in kvstudy/config/schema.py; alpha and beta (eq. 4) only when adaptive
        check_group("policy", {
            "_target_": "kvstudy.cacheopt.policy.CacheOPT", "padding": padding, "selection": selection,
            "preemption": preemption, "strategy": strategy, "allocation": allocation,
            "critical_waiting": critical_waiting, "token_budget": token_budget, "max_num_seqs": max_num_seqs,
            "buffer": buffer, "m": m, "reserve_blocks": reserve_blocks, "rlp_padding": rlp_padding,
            "calibration_requests": calibration_requests, "confidence": confidence,
            **({"alpha": alpha, "beta": beta} if adaptive else {}), "direction_accuracy": direction_accuracy,
            "fixed_fraction": fixed_fraction, "rate_window": rate_window, "epsilon": epsilon})
        self.token_budget, self.padding, self.confidence, self.adaptive = token_budget, padding, confidence, adaptive
        self.alpha, self.beta, self.rate_window, self.subtract_over = alpha, beta, float(rate_window), subtract_over
        self.fixed_fraction, self.rlp_padding, self.selection, self.embedding = fixed_fraction, rlp_padding, selection, embedding
        #: selection by deadline walks the policy's own queue (cacheopt/queue.py), never the engine's order
        self.own_queue_order = selection == "slo"
        self.buffer, self.allocation, self.proactive, self.m = buffer, allocation, proactive, m
        self.reserve_blocks, self.preemption, self.strategy, self.epsilon = reserve_blocks, preemption, strategy, epsilon
        self.max_num_seqs, self.direction_accuracy = max_num_seqs, direction_accuracy
        self.preempt_for_waiting = bool(preempt_for_waiting)
        self.critical_waiting, self.link = critical_waiting, bool(link)
        self.calibration_requests = calibration_requests
        self.slo = dict(slo or {})
        self.name = name
        self.slo_tft = self.slo_tbt = None
        self.error_ranges: Dict = {}
        self.default_range = 0.0
        self.cost = None

    # --- what the run supplies (kvstudy/cacheopt/setup.py) ------------------------------------------------------
    def prepare(self, slo_tft, slo_tbt, error_ranges: Dict, cost=None) -> None:
        self.slo_tft, self.slo_tbt = list(map(float, slo_tft)), list(map(float, slo_tbt))
        self.error_ranges = dict(error_ranges)
        self.default_range = max(self.error_ranges.values()) if self.error_ranges else 0.0
        self.cost = cost

    def before_run(self, ctx) -> dict:
        """The run's preparation hook (kvstudy/running/run_context.py): SLOs, error ranges and costs computed from the run's
        context (kvstudy/cacheopt/setup.py), then :meth:`prepare`; the engine receives the direction classifier."""
        from kvstudy.cacheopt.setup import prepare

        self._prepared = prepare(ctx, self)
        return {"direction": self._prepared["direction"]}

    def after_run(self, result, ctx) -> None:
        """Each request's SLOs, direction and padded estimate in the requests table; counters in the summary."""
        from kvstudy.cacheopt.setup import annotate

        annotate(result, ctx.requests, self, self._prepared)

    def reset(self, seed: int) -> None:
        super().reset(seed)
        self._so: List[int] = []  # padded output estimate s_o per arrived request
        self._t_max = 0.0
        self._links: Dict[int, List[int]] = {}  # step 10: cut request -> [the running request it waits on, blocks]
        self._promised: Dict[int, int] = {}  # blocks of a running request's release promised to linked requests
        self._queue = DeadlineQueue()  # waiting and swapped requests in deadline (RT) order, kept across steps
        self._seen = 0  # arrivals already in the queue
        self._moved: tuple = ((), ())  # (started, preempted) by the previous decision: the queue's changes
        self.queue_rebuilds = 0  # times the queue disagreed with the engine's lists and was rebuilt (expected: 0)
        self.stalls = 0  # request-iterations a late request waited for a block
        self.causes: Dict[str, int] = {}  # preemptions by why: returned, conflict, critical_waiting, liveness
        self.embedded = 0
        self.confidences: List[float] = []
        self._own_arrivals: List[float] = []  # arrival times of this replica's requests (eq. (4)'s rate lambda)

    def estimates(self) -> List[int]:
        """s_o of every request that has arrived, in the engine's order (arrival)."""
        return list(self._so)

    # --- 1. estimates ------------------------------------------------------------------------------------------
    def _range(self, predicted: int, under: int) -> float:
        key = (predicted // 50, under)
        if key in self.error_ranges:
            return self.error_ranges[key]
        same = [k for k in self.error_ranges if k[1] == under]  # the nearest calibrated bin of this direction
        if not same:
            return self.default_range
        return self.error_ranges[min(same, key=lambda k: (abs(k[0] - key[0]), k[0]))]

    def _estimate(self, view: StepView, i: int) -> int:
        if view.state[i] == ELSEWHERE:
            return -1  # routed to another replica of a cluster: never scheduled here, not in this replica's rate
        x, room = int(view.predicted[i]), max(1, view.max_model_len - view.prompt[i])
        if self.padding == "fixed":
            return int(min(room, max(1, round(x * (1 + self.fixed_fraction)))))
        if self.padding == "rlp":
            return int(min(room, x + self.rlp_padding))
        c = self.confidence
        if self.adaptive:  # lambda: this engine's arrivals in the window (one replica: every arrival so far)
            own = self._own_arrivals
            own.append(view.arrival[i])
            lo = bisect.bisect_left(own, view.arrival[i] - self.rate_window)
            span = min(self.rate_window, view.arrival[i]) or self.rate_window
            c = adaptive_confidence(self.alpha, self.beta, (len(own) - lo) / span)
            self.confidences.append(c)
        under = 1 if view.direction is None else view.direction[i]
        return padded_output(x, under, self._range(x, under), c, room, self.subtract_over)

    # --- helpers ------------------------------------------------------------------------------------------------
    def _ctx(self, view: StepView, i: int) -> int:
        return view.prompt[i] + view.generated[i]

    def _slack(self, view: StepView, i: int, now: float) -> float:
        last = view.last_token_time(i)
        if last != last:  # no token yet
            return self.slo_tft[i] - (now - view.arrival[i])
        return self.slo_tbt[i] - (now - last)

    def _deadline(self, view: StepView, i: int) -> float:
        """When request i's slack runs out: arrival + SLO_tft before its first token, else its last token + SLO_tbt.
        The waiting queue is in this order (the ascending RT of Sec. 3.3: RT = deadline - now, the same order at
        every instant), ties by request index."""
        last = view.last_token_time(i)
        if last != last:
            return view.arrival[i] + self.slo_tft[i]
        return last + self.slo_tbt[i]

    def _mode(self, view: StepView, i: int) -> str:
        if view.in_prefill(i) or self.strategy == "recompute":
            return RECOMPUTE
        if self.strategy == "swap":
            return SWAP
        if self.cost is None:
            return RECOMPUTE
        c = self.cost
        return choose_mode(self._ctx(view, i), c.sweet_spot, lambda x: float(c.recompute(x)), lambda x: float(c.swap(x)))

    def _victims(self, view: StepView, exclude) -> List[int]:
        pool = [i for i in view.running if i not in exclude]
        if self.preemption == "fcfs":
            return pool[::-1]  # vLLM: the latest admitted first
        mem = view.memory
        order = victim_order([self.slo_tbt[i] for i in pool],
                             [max(0, self._so[i] - view.generated[i]) for i in pool],
                             [mem.held(i) * mem.block_size for i in pool])
        return [pool[k] for k in order]

    # --- the step -----------------------------------------------------------------------------------------------
    def step(self, view: StepView) -> Decision:
        if self.slo_tft is None:
            raise ConfigError("policy 'cacheopt' needs per-request SLOs: run it through kvstudy's api (which calls "
                              "prepare) or call policy.prepare(...) first")
        now, mem = view.time, view.memory
        bs = mem.block_size
        while len(self._so) < view.num_arrived:
            self._so.append(self._estimate(view, len(self._so)))
        self._t_max = max(self._t_max, view.last_iteration_seconds)  # iterations only, never idle time
        d = Decision()
        # the reserve is for running requests that run out; with none running it would only keep a large prompt out
        st = _State(view, self.reserve_blocks if view.running else 0)
        if self._links:
            self._serve_links(view, st, d)
        so, eps, t_max = self._so, self.epsilon, self._t_max

        def preempt_until(blocks_needed: int, protect, cause: str) -> bool:
            """Preempt in victim order until the pool has ``blocks_needed`` (reserve included); False if it cannot."""
            order = self._victims(view, st.victims | protect | {h for _, h, _ in d.lend})
            gain = sum(st.freeable(v) for v in order)
            if st.free + gain < blocks_needed:
                return False
            for v in order:
                if st.free >= blocks_needed:
                    break
                st.preempt(v, self._mode(view, v), d)
                self.causes[cause] = self.causes.get(cause, 0) + 1
            return st.free >= blocks_needed

        # 1. running requests that used up their allocation ("returned"): a block each, critical ones first
        returned = [i for i in view.running if i in view.growing and not view.in_prefill(i)
                    and view.decode_blocks_needed(i) > 0]
        late: List[int] = []
        if returned:
            slack = {i: self._slack(view, i, now) for i in returned}
            returned.sort(key=lambda i: slack[i])
            for i in returned:
                if i in st.victims or i in st.grown:  # grown: a linked request got its blocks this step
                    continue
                if st.take(1, reserve_ok=True):
                    st.grown.add(i)
                    continue
                guests = [g for g, (h, _) in mem.loans.items() if h == i and g not in st.victims]
                if guests:  # the conflict rule: the host's growth reached its guest's region
                    for g in guests:
                        st.preempt(g, self._mode(view, g), d)
                        self.causes["conflict"] = self.causes.get("conflict", 0) + 1
                    if st.take(1, reserve_ok=True):
                        st.grown.add(i)
                        continue
                if slack[i] - t_max < eps and preempt_until(1, {i} | st.grown, "returned"):
                    st.take(1, reserve_ok=True)
                    st.grown.add(i)
                else:
                    late.append(i)
        # 2. waiting (new, recomputing) and swapped requests in selection order: by deadline (slo), or swapped
        # then waiting in the engine's order (fcfs)
        if self.selection == "slo":
            self._sync_queue(view)
            waiting = self._queue
        else:
            waiting = list(chain(view.swapped, view.waiting))
        decoders = len(view.running) - len(view.prefilling)
        budget = self.token_budget - (decoders - len(st.victims_decoding(view)))
        for i in view.prefilling:  # unfinished chunked prefills continue first
            if i in st.victims or budget <= 0:
                continue
            chunk = min(view.prefill_target[i] - view.prefilled[i], budget)
            budget -= chunk
            d.prefill.append((i, chunk))
        scan = view.held_and_context() if (self.embedding and len(waiting)) or self.proactive or self.link else []
        self._scan = scan
        hosts = self._hosts(view, st, scan) if self.embedding else []
        self._host_order = None  # hosts by unused allocation, built when the first embedding is tried
        admitted: List[int] = []
        critical = []
        if self.selection == "slo":
            # 0 <= RT < T_max + eps, RT = deadline - now: the requests whose deadline is in that window (widened by
            # far more than rounding, then checked exactly)
            for i in waiting.window(now - 1e-6, now + t_max + eps + 1e-6):
                last = view.last_token_time(i)  # nan before the first token
                if 0 <= self._slack(view, i, now) < t_max + eps and (self.critical_waiting == "any" or last != last):
                    critical.append(i)  # first_token: N_w holds new requests racing their TTFT SLO (Sec. 3.3)
        for i in sorted(critical, key=lambda i: -(self._ctx(view, i) + bs)):
            budget = self._admit(view, st, d, i, budget, hosts, admitted, preempt_until)
        # 3. non-critical: late returned requests, proactive top-ups and waiting requests within the budget
        cand, base, want = [], [], []
        for i in late:
            if i in st.victims:  # preempted later in this step (for another returned or a critical request)
                continue
            cand.append(i)
            base.append(bs)
            want.append(max(bs, (view.prompt[i] + so[i]) - mem.held(i) * bs))
        if self.proactive:
            m, mml, prompt = self.m, view.max_model_len, view.prompt
            for i, a_i, u_i in scan:
                if a_i - u_i > m or i in st.victims or i in st.grown or i in late:
                    continue
                target = min(mml, prompt[i] + so[i])
                if a_i < target:
                    cand.append(i)
                    base.append(0)
                    want.append(target - a_i)
        queued = 0
        for i in waiting:
            if i in admitted or i in critical:
                continue
            if budget <= 0 or st.num_seqs + queued >= self.max_num_seqs:
                break
            if self.embedding and self._embed(view, st, d, i, hosts):
                admitted.append(i)
                budget = self._start(view, d, i, budget)
                continue
            cand.append(i)
            queued += 1
            need = self._need(view, i)
            base.append(min(need + bs, mem.num_blocks * bs))
            want.append(max(base[-1], min(view.prompt[i] + so[i], mem.num_blocks * bs)))
            budget -= 1 if view.state[i] == SWAPPED else min(budget, view.prompt[i] + view.waiting_generated[i])
        if cand:
            self._distribute(view, st, d, cand, base, want, late)
        # 4. the batch: victims leave every list; a late request without a block stalls
        if st.victims:
            d.prefill = [(i, c) for i, c in d.prefill if i not in st.victims]
            d.reserve = {i: t for i, t in d.reserve.items() if i not in st.victims}
        stall = {i for i in late if i not in st.grown and i not in st.victims}
        if stall and not d.prefill and not d.swap_in and all(i in stall or i in st.victims or view.in_prefill(i)
                                                              for i in view.running):
            # nothing would run and the clock would not move: the most urgent stalled request goes ahead [D]
            first = min(stall, key=lambda i: (slack[i], i))
            if st.take(1, reserve_ok=True) or (preempt_until(1, {first}, "liveness") and st.take(1, reserve_ok=True)):
                st.grown.add(first)
            stall = {i for i in late if i not in st.grown and i not in st.victims}
        if stall or st.victims:
            decoding = [i for i in view.running if i not in st.victims and not view.in_prefill(i) and i not in stall]
            n_decoding = len(decoding)
        else:  # everyone past the prefill decodes
            n_decoding = len(view.running) - len(view.prefilling)
        self._cap_chunks(view, d, n_decoding + len(d.swap_in))
        if stall:
            d.decode = decoding + list(d.swap_in)
        else:
            d.decode_all = bool(n_decoding) or bool(d.swap_in)
        self.stalls += len(stall)
        self._moved = ([i for i, _ in d.prefill if view.state[i] == WAITING] + list(d.swap_in),
                       [v for v, _ in d.preempt])
        return d

    # --- pieces of the step -------------------------------------------------------------------------------------
    def _need(self, view: StepView, i: int) -> int:
        """Tokens a waiting request's KV takes when it starts: its context (a swapped one: on the host)."""
        if view.state[i] == SWAPPED:
            return view.memory.swapped_blocks(i) * view.memory.block_size
        return view.prompt[i] + view.waiting_generated[i]

    def _sync_queue(self, view: StepView) -> None:
        """The deadline queue after the previous decision: its starts leave, its victims and new arrivals enter."""
        q, state = self._queue, view.state
        started, preempted = self._moved
        for i in started:
            q.drop(i)
        for i in preempted:
            if state[i] == WAITING or state[i] == SWAPPED:
                q.push(self._deadline(view, i), i)
        arrival, slo_tft = view.arrival, self.slo_tft
        for i in view.joined:  # handed off to this replica (disaggregation): by their own deadline, as arrivals
            q.push(arrival[i] + slo_tft[i], i)
        for i in range(self._seen, view.num_arrived):
            if state[i] == WAITING:
                q.push(arrival[i] + slo_tft[i], i)
        self._seen = view.num_arrived
        self._moved = ((), ())
        if len(q) != len(view.waiting) + len(view.swapped):  # something else moved a request: start over
            self.queue_rebuilds += 1
            q.rebuild((self._deadline(view, i), i) for i in chain(view.swapped, view.waiting))

    def _hosts(self, view: StepView, st: "_State", scan) -> List[list]:
        """Running requests with more than ``buffer`` allocated-but-unused tokens that are no one's guest."""
        loans, victims, buffer = view.memory.loans, st.victims, self.buffer
        return [[j, a_j, u_j] for j, a_j, u_j in scan if a_j - u_j > buffer and j not in victims and j not in loans]

    def _embed(self, view: StepView, st: "_State", d: Decision, i: int, hosts: List[list]) -> bool:
        """Borrow a host's unused allocation for waiting request i (best fit); False if none fits."""
        if not hosts or view.state[i] == SWAPPED:
            return False
        bs = view.memory.block_size
        s_p, s_o = self._need(view, i), max(1, self._so[i] - view.waiting_generated[i])
        # feasible(a, u, s_p, s_o, b) is a - u >= s_p + 2 s_o + b (whole tokens); the best fit is the host with the
        # least a - u among those (then the first in running order): the first in (a - u, position) order
        if self._host_order is None:
            self._host_order = sorted((a - u, k) for k, (_, a, u) in enumerate(hosts))
        order, victims, k = self._host_order, st.victims, None
        for pos in range(bisect.bisect_left(order, (s_p + 2 * s_o + self.buffer, -1)), len(order)):
            if hosts[order[pos][1]][0] not in victims:
                k = order[pos][1]
                break
        if k is None:
            return False
        j, a_j, u_j = hosts[k]
        blocks = -(-(s_p + s_o) // bs)
        if a_j // bs - blocks < -(-(u_j + 1) // bs):
            return False
        d.lend.append((i, j, blocks))
        st.lent[j] = st.lent.get(j, 0) + blocks
        self.embedded += 1
        hosts[k][1] = a_j - blocks * bs
        order.remove((a_j - u_j, k))
        bisect.insort(order, (a_j - blocks * bs - u_j, k))
        st.num_seqs += 1
        return True

    def _start(self, view: StepView, d: Decision, i: int, budget: int) -> int:
        """Request i runs this iteration: a swap-in decodes (one token), a prefill takes a chunk of the budget."""
        if view.state[i] == SWAPPED:
            d.swap_in.append(i)
            return budget - 1
        chunk = min(view.prompt[i] + view.waiting_generated[i], max(budget, 0))
        d.prefill.append((i, chunk))
        return budget - chunk

    def _admit(self, view, st, d, i, budget, hosts, admitted, preempt) -> int:
        """A critical waiting request: embedded, else s_p + B from the pool, preempting if that can make room."""
        if budget <= 0 or st.num_seqs >= self.max_num_seqs:
            return budget
        if self.embedding and self._embed(view, st, d, i, hosts):
            admitted.append(i)
            return self._start(view, d, i, budget)
        mem, bs = view.memory, view.memory.block_size
        if view.state[i] == SWAPPED:
            blocks = mem.swap_in_blocks(i, view.prompt[i] + view.waiting_generated[i])
        else:
            blocks = min(mem.blocks(self._need(view, i) + bs), mem.num_blocks)
        if not st.take(blocks, reserve_ok=False):
            if not self.preempt_for_waiting or not preempt(blocks + st.reserve, st.grown | {h for _, h, _ in d.lend}, "critical_waiting"):
                return budget
            st.take(blocks, reserve_ok=False)
        st.num_seqs += 1
        admitted.append(i)
        if view.state[i] != SWAPPED:
            d.reserve[i] = blocks * bs
        return self._start(view, d, i, budget)

    def _distribute(self, view, st, d, cand, base, want, late) -> None:
        """Step 10: share the pool among the non-critical requests (allocation.py), dropping the last waiting
        ones while even the floors do not fit."""
        mem, bs, now = view.memory, view.memory.block_size, view.time
        # the running candidates (late, proactive) come first, the waiting ones after: the last waiting one is the
        # last candidate, while it is waiting (one pass with a running sum; the floors are whole tokens)
        pool, total, state = (st.free - st.reserve) * bs, sum(base), view.state
        while cand and total > pool and state[cand[-1]] in (WAITING, SWAPPED):
            total -= base.pop()
            cand.pop()
            want.pop()
        if not cand:
            return
        pool = max(0, pool)
        slack = [max(1e-3, self._slack(view, i, now)) for i in cand]
        prompt = [view.prompt[i] for i in cand]
        output = [max(1, self._so[i]) for i in cand]
        alloc, _ = allocate(want, base, slack, prompt, output, pool, mode=self.allocation)
        for i, b, w, a in zip(cand, base, want, alloc):
            # a full grant is rounded up to whole blocks, a cut one down (never below the floor's blocks)
            blocks = -(-int(round(a)) // bs) if a >= w - 1e-9 else int(a // bs)
            blocks = max(blocks, -(-int(b) // bs))
            cut = w - blocks * bs
            if view.state[i] == RUNNING:  # running: a late returned request needs its block, a proactive one a top-up
                if blocks <= 0 or not st.take(blocks + (1 if i in late else 0), reserve_ok=i in late):
                    if i in late and st.take(1, reserve_ok=True):
                        st.grown.add(i)
                    continue
                if i in late:
                    st.grown.add(i)
                d.reserve[i] = (mem.held(i) + blocks) * bs
                if cut > 0:
                    self._link(view, st, i, cut, d.reserve[i] - self._ctx(view, i))
                continue
            if st.num_seqs >= self.max_num_seqs:
                continue
            if view.state[i] == SWAPPED:
                if not st.take(mem.swap_in_blocks(i, view.prompt[i] + view.waiting_generated[i]), reserve_ok=False):
                    continue
                st.num_seqs += 1
                d.swap_in.append(i)
                continue
            if not st.take(blocks, reserve_ok=False):
                continue
            st.num_seqs += 1
            d.reserve[i] = min(blocks * bs, view.max_model_len)
            chunk = view.prompt[i] + view.waiting_generated[i]
            d.prefill.append((i, chunk))
            if cut > 0:
                self._link(view, st, i, cut, blocks * bs - chunk)

    def _link(self, view: StepView, st: "_State", i: int, short: float, exhaust_in: int) -> None:
        """Step 10 (Sec. 3.3.2): request i's allocation was cut by ``short`` tokens; it will use the KV of a running
        request r_j that releases "shortly before r_i exhausts its allocated KVC" (in ``exhaust_in`` tokens, one per
        iteration) and releases at least the shortfall. r_j releases when its predicted output s_o is done, in
        s_o - generated iterations; its release not yet promised to others counts. Among those, the latest release
        (the shortest wait), then the smallest sufficient release, then the lowest index [D]. None: no link."""
        if not self.link or i in self._links:
            return
        bs, so, prompt, promised, loans = view.memory.block_size, self._so, view.prompt, self._promised, view.memory.loans
        need = -(-int(short) // bs)
        best = None
        for j, a_j, u_j in self._scan:  # running past their prefill: (request, held tokens, context)
            when = max(0, so[j] - (u_j - prompt[j]))  # its predicted iterations left
            if when > exhaust_in or j == i or j in st.victims:
                continue
            release = (st.freeable(j) if j in loans else a_j // bs) - promised.get(j, 0) - st.lent.get(j, 0)
            if release < need:
                continue
            key = (-when, release, j)
            if best is None or key < best:
                best = key
        if best is not None:
            j = best[2]
            self._links[i] = [j, need]
            self._promised[j] = self._promised.get(j, 0) + need

    def _serve_links(self, view: StepView, st: "_State", d: Decision) -> None:
        """Linked requests whose r_j finished (its KV is free since the end of the last iteration) take their blocks
        first, before anything else in this step. A link lapses when r_i left the GPU, or when r_j was preempted:
        its KV then went to whoever preempted it [D]."""
        mem, bs = view.memory, view.memory.block_size
        for i, (j, need) in list(self._links.items()):
            # in flight (a pipeline's batch, kvstudy/engine/pipeline.py) is still on the GPU
            held_i = view.state[i] == RUNNING or view.state[i] == IN_FLIGHT
            held_j = view.state[j] == RUNNING or view.state[j] == IN_FLIGHT
            if not held_i or not (held_j or view.state[j] == DONE):
                self._unlink(i)
                continue
            if held_j or view.state[i] == IN_FLIGHT:  # r_j still holds its KV, or r_i cannot be named this step
                continue
            self._unlink(i)
            target = mem.blocks(min(view.max_model_len, view.prompt[i] + self._so[i]))
            blocks = min(need, target - mem.held(i), st.free)
            if blocks > 0 and st.take(blocks, reserve_ok=True):
                d.reserve[i] = (mem.held(i) + blocks) * bs
                st.grown.add(i)

    def _unlink(self, i: int) -> None:
        j, need = self._links.pop(i)
        left = self._promised.get(j, 0) - need
        if left > 0:
            self._promised[j] = left
        else:
            self._promised.pop(j, None)

    def _cap_chunks(self, view: StepView, d: Decision, decoding: int) -> None:
        """Chunks in order within the token budget left after the decodes; a new start with no budget left does
        not start (its blocks are not taken)."""
        left = self.token_budget - decoding
        out = []
        for i, chunk in d.prefill:
            if left <= 0:
                if view.state[i] == WAITING:  # a new start without budget: it does not start
                    d.reserve.pop(i, None)
                    d.lend = [x for x in d.lend if x[0] != i]
                continue
            c = min(chunk, left)
            left -= c
            out.append((i, c))
        d.prefill = out


class _State:
    """The step's running tally: free blocks (the reserve counted in), victims, who got a block, running count."""

    __slots__ = ("view", "free", "reserve", "victims", "grown", "num_seqs", "lent")

    def __init__(self, view: StepView, reserve_blocks: int) -> None:
        self.view = view
        self.free = view.memory.free
        self.reserve = min(reserve_blocks, view.memory.num_blocks // 2)
        self.victims, self.grown = set(), set()
        self.num_seqs = len(view.running)
        self.lent: Dict[int, int] = {}  # blocks each host lends in this step (they no longer come back to the pool)

    def take(self, blocks: int, reserve_ok: bool) -> bool:
        floor = 0 if reserve_ok else self.reserve
        if self.free - blocks < floor:
            return False
        self.free -= blocks
        return True

    def freeable(self, v: int) -> int:
        mem = self.view.memory
        loan = mem.loans.get(v)
        return mem.freed_by(v) - (loan[1] if loan and loan[0] in mem.gpu and loan[0] not in self.victims else 0)

    def preempt(self, v: int, mode: str, d: Decision) -> None:
        self.free += self.freeable(v)
        self.victims.add(v)
        self.grown.discard(v)
        self.num_seqs -= 1
        d.preempt.append((v, mode))

    def victims_decoding(self, view: StepView) -> List[int]:
        return [v for v in self.victims if not view.in_prefill(v)]
