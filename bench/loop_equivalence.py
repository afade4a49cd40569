"""The one loop on the paper's memory against the paper loop it replaced (issue 34), on random instances.

    git show 3484668:kvstudy/engine/paper_setting.py > /tmp/old_engine.py
    python bench/loop_equivalence.py /tmp/old_engine.py [TRIALS] [FIRST]

Each trial draws 1-39 requests (prompts 1-29, outputs 1-39, arrivals on a grid of quarter rounds or continuous), exact or
noisy predictions, one of nine admission policies (MC-SF, MC-Benchmark, alpha-protection greedy and beta-clearing,
fcfs_watermark, both in the paper's and the authors' readings, MC-SF with a margin), a latency model (unit, linear,
the MC-SF authors' formula), a capacity of 40-199 tokens and random engine settings (overflow cost batch / free /
authors_code, the Fig. 5 remedy, the authors' arrivals, a batch cap, a stall limit), and requires the status, message,
clearing count and both tables to be identical. Prints the differing trials and a total; exit status 1 if any.
"""
import importlib.util
import sys

import numpy as np

from kvstudy.engine import Engine
from kvstudy.latency.models import LinearLatency, McsfAuthorsLatency, UnitLatency
from kvstudy.policies.mcsf import MCSF, MCBenchmark
from kvstudy.policies.protection import AlphaProtection, FCFSWatermark
from kvstudy.workloads.requests import make_requests

POLICIES = [lambda: MCSF(), lambda: MCBenchmark(), lambda: AlphaProtection(0.3), lambda: AlphaProtection(0.2, 0.1),
            lambda: FCFSWatermark(), lambda: AlphaProtection(0.1, admission="authors_code"),
            lambda: AlphaProtection(0.2, 0.3, admission="authors_code"),
            lambda: MCSF(admission="authors_code", avg_batch_time=0.5), lambda: MCSF(margin=0.1)]
LATENCIES = [UnitLatency(), LinearLatency(d0=0.5, d1=0.01), McsfAuthorsLatency()]


def main(old_path: str, trials: int, first: int) -> int:
    spec = importlib.util.spec_from_file_location("old_engine", old_path)
    old = importlib.util.module_from_spec(spec)
    sys.modules["old_engine"] = old
    spec.loader.exec_module(old)
    bad = 0
    for trial in range(first, first + trials):
        rng = np.random.default_rng(trial)
        n = int(rng.integers(1, 40))
        arrival = np.round(np.sort(rng.uniform(0, 15, n)) * rng.choice([1, 4])) / 4
        req = make_requests(arrival, rng.integers(1, 30, n), rng.integers(1, 40, n), source="trial")
        pred = req.output_tokens if rng.random() < 0.5 else np.maximum(
            1, (req.output_tokens * rng.uniform(0.3, 1.6, n)).astype(int))
        which, lat = int(rng.integers(len(POLICIES))), LATENCIES[int(rng.integers(len(LATENCIES)))]
        capacity = int(rng.integers(40, 200))
        kw = dict(stall_limit=int(rng.integers(5, 60)), overflow_cost=str(rng.choice(["batch", "free", "authors_code"])),
                  raise_prediction_on_eviction=bool(rng.random() < 0.3),
                  arrivals=str(rng.choice(["paper", "authors_code"])),
                  max_batch=None if rng.random() < 0.6 else int(rng.integers(1, 6)))
        results = []
        for make in (old.Engine, Engine):
            policy = POLICIES[which]()
            policy.reset(trial)
            results.append(make(req, pred, policy, lat, capacity, **kw).run())
        a, b = results
        if not (a.status == b.status and a.message == b.message and a.clearing_events == b.clearing_events
                and a.requests.equals(b.requests) and a.iterations.equals(b.iterations)):
            bad += 1
            print(f"trial {trial}: differs (policy {which}, {kw}; {a.status} / {b.status})")
    print(f"{trials} trials, {bad} differing")
    return bad


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(1 if main(args[0], int(args[1]) if len(args) > 1 else 1000, int(args[2]) if len(args) > 2 else 0) else 0)
