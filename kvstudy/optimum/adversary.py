"""Theorem 4.1's adversarial instance (Jaillet et al., App. B.1) and the ratio it forces on a policy.

For memory M (a square, so sqrt(M)/2 is whole when M is a multiple of 4 squared): one long request (s = 1,
o = M - 1) at round 0; once the policy starts it at round b, M/2 short requests (s = 1, o = 1) arrive at
r = b + M - sqrt(M)/2. A deterministic policy's behaviour before r does not depend on the short requests,
so b is found by running the policy on the long request alone. OPT is at most the explicit schedule of
the proof (long first if r >= M, else shorts at r and the long request after them), which the checker
verifies; the policy's total latency over that schedule's is therefore a lower bound on its ratio, which
the theorem says grows like sqrt(n), n = M/2 + 1.
"""
from __future__ import annotations

import math

import numpy as np

from kvstudy.optimum.checker import check
from kvstudy.optimum.instance import Instance
from kvstudy.optimum.online import starts


def instance_for(policy_factory, M: int):
    root = math.isqrt(M)
    if root * root != M or root % 2:
        raise ValueError(f"M={M}: use an even perfect square so sqrt(M)/2 is a whole number of rounds")
    long_only = Instance(np.array([0]), np.array([1]), np.array([M - 1]), M)
    b = int(starts(long_only, policy_factory())[0])
    r = b + M - root // 2
    shorts = M // 2
    inst = Instance(np.concatenate([[0], np.full(shorts, r)]), np.ones(shorts + 1, dtype=np.int64),
                    np.concatenate([[M - 1], np.ones(shorts, dtype=np.int64)]), M)
    if r >= M:
        explicit = np.concatenate([[0], np.full(shorts, r)])
    else:
        explicit = np.concatenate([[r + 2], np.full(shorts, r)])
    return inst, explicit


def ratio_lower_bound(policy_factory, M: int) -> dict:
    inst, explicit = instance_for(policy_factory, M)
    opt_upper = check(inst, explicit)
    alg = check(inst, starts(inst, policy_factory()))
    return {"M": M, "n": inst.n, "policy_latency": alg, "opt_upper_bound": opt_upper,
            "ratio_at_least": alg / opt_upper, "sqrt_n": math.sqrt(inst.n)}
