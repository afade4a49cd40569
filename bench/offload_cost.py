"""Issue 49's speed acceptance: the simulator's cost per iteration with offload tiers against the prefix cache alone,
on the study's runs (Mooncake's first 3,000 requests at 0.125 of the trace's rate, Llama-3.1-8B on one A100).

    python bench/offload_cost.py [ROUNDS] [POLICY ...]      (default 3 rounds, vllm lpm mcsf_prefix)

Each round runs every host-tier size once, interleaved (so drift of the machine falls on all alike); prints per
setting the best and median microseconds per iteration (simulate_seconds / iterations) and the ratio of the best to
the tier-less run's best.
"""
import statistics
import sys

from kvstudy import api

SIZES = ["null", "64", "256", "1000", "1e9"]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    policies = sys.argv[2:] or ["vllm", "lpm", "mcsf_prefix"]
    for policy in policies:
        cfgs = {size: api.compose([f"+policy={policy}", "memory=paged_offload", "workload=mooncake",
                                   "workload.num_requests=3000", "workload.rate_scale=0.125",
                                   "memory.capacity_tokens=auto", "model=llama31_8b", "hardware=a100_tp1",
                                   "engine.progress=false", f"memory.offload.host_gb={size}"]) for size in SIZES}
        api.simulate(cfgs["null"])  # the predictor loaded
        us = {size: [] for size in SIZES}
        for _ in range(rounds):
            for size, cfg in cfgs.items():
                _, s = api.simulate(cfg)
                us[size].append(1e6 * s["simulate_seconds"] / s["iterations"])
        base = min(us["null"])
        for size in SIZES:
            print(f"{policy:12s} host_gb={size:5s} best {min(us[size]):6.1f} us/iteration, median "
                  f"{statistics.median(us[size]):6.1f}, best / tier-less best {min(us[size]) / base:.2f}")


if __name__ == "__main__":
    main()
