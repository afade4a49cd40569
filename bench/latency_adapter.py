"""Benchmark the Vidur latency adapter: cold build, warm load, microseconds per warm query.

    python bench/latency_adapter.py [model=llama2_70b hardware=a100_tp2]

A cold build uses a fresh temporary cache folder; the warm load then reads what it wrote.
"""
import os
import sys
import tempfile
import time

import numpy as np


def main(argv):
    os.environ["KVSTUDY_CACHE_DIR"] = tempfile.mkdtemp(prefix="kvbench-")
    from kvstudy import api

    cfg = api.compose(argv)
    arch, hw, capacity, _ = api.model_setup(cfg, latency=False)  # the latency build is what is timed
    t0 = time.perf_counter()
    api.build_latency(cfg, arch, hw, capacity)  # cold: trains Vidur's predictor into the empty cache
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = api.build_latency(cfg, arch, hw, capacity)
    warm_s = time.perf_counter() - t0
    assert warm.info["source"] == "cache"
    rng = np.random.default_rng(0)
    queries = []
    for _ in range(20000):
        nd = int(rng.integers(0, 300))
        chunks = [(int(s), 0) for s in rng.integers(1, 400, rng.integers(0, 4))]
        queries.append((chunks, nd, int(nd * rng.integers(20, 600))))
    t0 = time.perf_counter()
    for q in queries:
        warm.iteration_seconds(*q)
    per_query_us = (time.perf_counter() - t0) / len(queries) * 1e6
    print(f"model={arch.name} hardware={hw.name} capacity={capacity}")
    print(f"settings: {warm.info['settings']}")
    print(f"cross-validated MAPE % (shuffled {warm.info['settings']['k_fold_cv_splits']}-fold): "
          + ", ".join(f"{k} {v:.2f}" for k, v in warm.info["cv_mape_pct"].items()))
    print(f"cold build {cold_s:.1f} s | warm load {warm_s:.3f} s | warm query {per_query_us:.1f} us")
    print(f"(a) 512-token prefill      {warm.iteration_seconds([(512, 0)], 0, 0) * 1e3:.2f} ms")
    print(f"(b) 64 decodes at 600 ctx  {warm.iteration_seconds([], 64, 64 * 600) * 1e3:.2f} ms")
    print(f"(c) mixed (a)+(b)          {warm.iteration_seconds([(512, 0)], 64, 64 * 600) * 1e3:.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
