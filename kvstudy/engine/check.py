"""The decision check: everything a policy's :class:`~kvstudy.policies.step.Decision` asks is validated here before
the engine changes anything (the engine, not the policy, owns time and KV accounting; vLLM's and SGLang's schedulers
assert the same invariants inside their block managers).

A decision passes when every request it names is named once, in the state its list needs, in a mode the memory model
can do, and (on a memory that tracks blocks) the blocks the cache holds after it fit. Any failure raises
:class:`~kvstudy.engine.states.PolicyError` naming the first problem; :func:`located` adds where the run was.
"""
from __future__ import annotations

import numpy as np

from kvstudy.engine.states import RUNNING, SWAPPED, WAITING, PolicyError
from kvstudy.policies.step import SWAP, Decision

STATE_NAMES = ("future", "waiting", "running", "done", "rejected", "swapped", "elsewhere", "in_flight")


def check_decision(engine, d: Decision, name: str) -> None:
    """Validate ``d`` against the run's state (module docstring); raises PolicyError, changes nothing."""
    if not isinstance(d, Decision):
        raise PolicyError(f"policy '{name}' returned {type(d).__name__}, not a Decision")
    st, mem = engine.state, engine.memory
    if not (d.preempt or d.swap_in or d.prefill or d.decode or d.reserve or d.lend):  # the common decode-only step
        if d.decode_all and mem.tracks_blocks and mem.used + len(st.growing) > mem.num_blocks:
            raise PolicyError(f"policy '{name}' decodes every running request, which needs "
                              f"{mem.used + len(st.growing)} KV blocks, more than the {mem.num_blocks} the "
                              f"cache has")
        return
    if d.decode_all and not (d.preempt or d.swap_in or d.decode or d.reserve or d.lend) and _admissions_ok(engine, d):
        return  # the next most common step: waiting requests start whole prefills, everyone decodes
    preempted = _check_entries(engine, d, name)
    guests = _check_lend(engine, d, name, preempted)
    if mem.tracks_blocks:  # the paper's memory: admissions are not checked (an overflow is, next round)
        _check_blocks(engine, d, name, preempted, guests)


def _admissions_ok(engine, d: Decision) -> bool:
    """A decision of whole prefills of distinct waiting requests plus ``decode_all``, checked the short way (the
    same rules as the full check); False: the full check runs and names the problem, if any."""
    st, mem = engine.state, engine.memory
    state, tokens, s = st.request_state, st.clock.tokens, st.prompt
    n, seen, need = len(s), set(), 0
    for item in d.prefill:
        if type(item) is not tuple or len(item) != 2:
            return False
        i, chunk = item
        if type(i) is not int or not 0 <= i < n or i in seen or state[i] != WAITING or type(chunk) is not int \
                or not 0 < chunk <= s[i] + tokens[i]:
            return False
        seen.add(i)
        need += mem.blocks(s[i] + tokens[i])
    return not mem.tracks_blocks or mem.used + need + len(st.growing) <= mem.num_blocks


def _check_entries(engine, d: Decision, name: str) -> set:
    """Each list's entries: shape, ids named once, states, modes, chunk sizes. Returns the preempted requests."""
    st, mem = engine.state, engine.memory
    state, ids = st.request_state, st.request_id
    seen = set()

    def once(i, what):
        if not isinstance(i, (int, np.integer)) or not 0 <= i < len(state):
            raise PolicyError(f"policy '{name}' names request {i!r} in {what}: not a request of this run")
        if i in seen:
            raise PolicyError(f"policy '{name}' names request {ids[i]} twice in one decision")
        seen.add(i)

    for item in d.preempt:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise PolicyError(f"policy '{name}': preempt entries are (request, mode), got {item!r}")
        i, mode = item
        once(i, "preempt")
        if state[i] != RUNNING:
            raise PolicyError(f"policy '{name}' preempts request {ids[i]}, which is not running "
                              f"(state {STATE_NAMES[state[i]]})")
        if mode not in mem.modes:
            raise PolicyError(f"policy '{name}': preemption mode {mode!r} is not one memory="
                              f"{mem.name} can do (allowed: {', '.join(mem.modes)})")
        if mode == SWAP and st.prefilled[i] < st.prefill_target[i]:
            raise PolicyError(f"policy '{name}' swaps request {ids[i]} in the middle of its prefill; "
                              f"only a decoding request can be swapped (recompute it)")
    preempted = {i for i, _ in d.preempt}
    for i in d.swap_in:
        once(i, "swap_in")
        if state[i] != SWAPPED:
            raise PolicyError(f"policy '{name}' swaps in request {ids[i]}, which is not swapped out "
                              f"(state {STATE_NAMES[state[i]]})")
    for item in d.prefill:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise PolicyError(f"policy '{name}': prefill entries are (request, tokens), got {item!r}")
        i, chunk = item
        once(i, "prefill")
        remaining = st.prefill_target[i] - st.prefilled[i]
        if state[i] == WAITING:
            remaining = st.prompt[i] + st.generated[i]
        elif state[i] != RUNNING or i in preempted or remaining == 0:
            raise PolicyError(f"policy '{name}' prefills request {ids[i]}, which is neither waiting nor "
                              f"running with its prefill unfinished (state {STATE_NAMES[state[i]]})")
        if not isinstance(chunk, (int, np.integer)) or not 0 < chunk <= remaining:
            raise PolicyError(f"policy '{name}' gives request {ids[i]} a prefill chunk of {chunk!r} "
                              f"tokens; allowed 1..{remaining}")
    _check_decodes(engine, d, name, once, preempted)
    for i, tokens in d.reserve.items():
        alone = isinstance(i, (int, np.integer)) and 0 <= i < len(state) and i not in seen \
            and state[i] == RUNNING  # a running request's top-up
        if not (i in seen or alone) or i in preempted or not isinstance(tokens, (int, np.integer)) or tokens < 0:
            raise PolicyError(f"policy '{name}': reserve {{{i!r}: {tokens!r}}} must name a request of this "
                              f"decision or a running one, not preempted, with a token count >= 0")
    return preempted


def _check_decodes(engine, d: Decision, name: str, once, preempted: set) -> None:
    st = engine.state
    state, ids = st.request_state, st.request_id
    swapping_in = set(d.swap_in)
    if d.decode_all and d.decode:
        raise PolicyError(f"policy '{name}': a decision has decode_all or a decode list, not both")
    for i in d.decode:
        if i not in swapping_in:  # a request swapped back in may decode in the same iteration
            once(i, "decode")
        elif d.decode.count(i) > 1:
            raise PolicyError(f"policy '{name}' names request {ids[i]} twice in decode")
        ok = (state[i] == RUNNING and i not in preempted) or i in swapping_in
        if not ok or st.prefilled[i] < st.prefill_target[i]:
            raise PolicyError(f"policy '{name}' decodes request {ids[i]}, which is not running with its "
                              f"prefill complete (state {STATE_NAMES[state[i]]})")


def _check_lend(engine, d: Decision, name: str, preempted: set) -> set:
    """CacheOPT's embedding: each guest starts its prefill here, each host keeps room for its next token. Returns the
    guests."""
    st, mem = engine.state, engine.memory
    state, ids, s, gen = st.request_state, st.request_id, st.prompt, st.generated
    lent, guests = {}, set()
    starting = {i for i, _ in d.prefill if state[i] == WAITING} if d.lend else ()
    for item in d.lend:
        if not (isinstance(item, tuple) and len(item) == 3):
            raise PolicyError(f"policy '{name}': lend entries are (guest, host, blocks), got {item!r}")
        g, h, b = item
        if g not in starting or g in guests:
            raise PolicyError(f"policy '{name}' lends to request {g!r}, which is not starting its prefill in this "
                              f"decision (or is named twice in lend)")
        if not isinstance(h, (int, np.integer)) or not 0 <= h < len(state) or state[h] != RUNNING \
                or h in preempted or h in mem.loans:
            raise PolicyError(f"policy '{name}' borrows from request {h!r}, which is not a running request that "
                              f"is kept in this decision and holds no loan itself")
        lent[h] = lent.get(h, 0) + b
        keep = mem.blocks(s[h] + gen[h] + (0 if st.prefilled[h] < st.prefill_target[h] else 1))
        if not isinstance(b, (int, np.integer)) or b < mem.blocks(s[g] + gen[g]) \
                or mem.held(h) + (max(0, mem.blocks(d.reserve[h]) - mem.held(h)) if h in d.reserve else 0) \
                - lent[h] < keep:
            raise PolicyError(f"policy '{name}' lends {b!r} blocks of request {ids[h]} to request "
                              f"{ids[g]}: the guest needs at least its context's blocks, the host keeps "
                              f"{keep} (its next token's)")
        if g in d.reserve and mem.blocks(d.reserve[g]) > b:
            raise PolicyError(f"policy '{name}' reserves more for guest {ids[g]} than it borrows")
        guests.add(g)
    return guests


def _check_blocks(engine, d: Decision, name: str, preempted: set, guests: set) -> None:
    """The blocks in use after the decision, counted before any change (the engine's own arithmetic), fit."""
    st, mem = engine.state, engine.memory
    state, s, gen = st.request_state, st.prompt, st.generated
    freed = sum(mem.held(i) for i in preempted)
    need = 0
    for i in d.swap_in:
        need += mem.swap_in_blocks(i, s[i] + gen[i])
    starts = [i for i, _ in d.prefill if state[i] == WAITING and i not in guests]
    for i in starts:
        need += mem.blocks(s[i] + gen[i])
    if d.decode_all:
        need += len(st.growing) - sum(1 for i in preempted if i in st.growing)
    swapping_in = set(d.swap_in)
    for i in d.decode:
        if i not in swapping_in:
            need += max(0, mem.blocks(s[i] + gen[i]) - mem.held(i))
    for i, tokens in d.reserve.items():
        if i in guests:
            continue
        base = mem.held(i) if state[i] == RUNNING else 0
        need += max(0, mem.blocks(tokens) - max(base, mem.blocks(s[i] + gen[i])))
    if mem.prefix_caching and (preempted or (starts and mem.used - freed + need > mem.num_blocks)):
        # count shared blocks once (without victims the plain count above is an upper bound; a victim's held blocks
        # may be shared, so with victims always): a victim frees what no one else uses; a start takes what it does
        # not share (one sharing a block another start of this decision caches is counted in full)
        gain, dropped = mem.release_gain(preempted)
        need -= sum(mem.blocks(s[i] + gen[i]) - mem.start_blocks(i, s[i] + gen[i], dropped) for i in starts)
        freed = gain
    if mem.used - freed + need > mem.num_blocks:
        if engine.adapted:  # a user's order + admit policy never wrote a "decision"
            raise PolicyError(f"policy '{name}' admits requests whose prefills need {mem.used - freed + need} KV "
                              f"blocks with the running requests', more than the {mem.num_blocks} the cache has "
                              f"(memory={mem.name} charges a prefill in its own iteration: keep "
                              f"view.running_kv_tokens + view.kv_need(prompt) within view.capacity)")
        raise PolicyError(f"policy '{name}' needs {mem.used - freed + need} KV blocks after its decision, more "
                          f"than the {mem.num_blocks} the cache has (it starts "
                          f"{st.ids(i for i, _ in d.prefill if state[i] == WAITING)}, swaps in "
                          f"{st.ids(d.swap_in)}, preempts {st.ids(i for i, _ in d.preempt)})")


def located(engine, exc: PolicyError, step: int, t: float) -> PolicyError:
    """A refused decision, named with where the run was: the iteration, its time, who waits, runs, is swapped
    out, and the blocks in use."""
    st, mem = engine.state, engine.memory
    blocks = f", {mem.used}/{mem.num_blocks} KV blocks in use" if mem.tracks_blocks else ""
    return PolicyError(f"iteration {step} (time {t:.6g}): {exc}; {len(st.waiting)} waiting, running "
                       f"{st.ids(st.running)}, {len(st.swapped)} swapped out{blocks}")
