"""Benchmark one MC-SF / MC-Benchmark admission decision at M = 16492 with >= 1,000 waiting requests.

    python bench/admission_check.py

The running set is what MC-SF holds in steady state on the LMSYS workload (taken from a simulated
state), the queue 1,000-4,000 LMSYS-like waiting requests.
"""
import time

import numpy as np

from kvstudy.policies.base import SchedulerView
from kvstudy.policies.mcsf import MCSF, MCBenchmark
from kvstudy.workloads.lmsys import lmsys


def view(waiting: int, rng) -> SchedulerView:
    df = lmsys(waiting + 400, rng, max_model_len=4096)
    s, o = df.prompt_tokens.to_numpy(), df.output_tokens.to_numpy()
    # fill a running set up to ~90% of M with requests part-way through their outputs
    run_idx, used = [], 0
    for i in range(waiting, waiting + 400):
        gen = int(rng.integers(0, o[i]))
        if used + s[i] + o[i] > 0.9 * 16492:
            break
        run_idx.append((i, gen))
        used += s[i] + o[i]
    ri = np.array([i for i, _ in run_idx])
    rg = np.array([g for _, g in run_idx])
    w = np.arange(waiting)
    return SchedulerView(round=100, time=10.0, capacity=16492, waiting_ids=w, waiting_prompt=s[w],
                         waiting_predicted=o[w], waiting_arrival=np.sort(rng.uniform(0, 10, waiting)),
                         running_ids=ri, running_prompt=s[ri], running_generated=rg, running_predicted=o[ri],
                         running_arrival=np.zeros(len(ri)))


def main():
    rng = np.random.default_rng(0)
    for waiting in (1000, 4000):
        v = view(waiting, rng)
        for policy in (MCSF(), MCBenchmark()):
            policy.reset(0)
            reps = 300
            t0 = time.perf_counter()
            for _ in range(reps):
                admitted = policy.schedule(v)
            us = (time.perf_counter() - t0) / reps * 1e6
            print(f"{policy.name:13s} waiting={waiting} running={len(v.running_ids)} admitted={len(admitted)}: "
                  f"{us:.0f} us per decision")


def in_simulation():
    """Per-iteration decision cost inside the card command's run (M = 16492, lambda = 50, 1,000 requests)."""
    from kvstudy import api

    for name in ("mcsf", "mc_benchmark"):
        cfg = api.compose([f"+policy={name}", "+demand=high", "engine.progress=false"])
        policy = api.build_policy(cfg)
        cls = type(policy)
        timings, queue = [], []
        original = cls.schedule

        def timed(self, view, _orig=original):
            t0 = time.perf_counter()
            out = _orig(self, view)
            timings.append(time.perf_counter() - t0)
            queue.append(len(view.waiting_ids))
            return out

        cls.schedule = timed
        try:
            api.simulate(cfg)
        finally:
            cls.schedule = original
        t, q = np.array(timings) * 1e6, np.array(queue)
        busy = q >= 200
        print(f"{name:13s} in simulation: {len(t)} decisions, mean {t.mean():.0f} us, p99 {np.percentile(t, 99):.0f} us; "
              f"with >=200 waiting: {busy.sum()} decisions, mean {t[busy].mean() if busy.any() else float('nan'):.0f} us; "
              f"max queue {q.max()}")


if __name__ == "__main__":
    main()
    in_simulation()
