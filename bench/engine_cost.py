"""Engine cost per iteration of every policy family: the MC-SF family on the paper's memory and on paged memory, vLLM,
Sarathi, RR-SJF and CacheOPT on paged memory (one loop since issue 34).

    python bench/engine_cost.py                  # this checkout
    python bench/engine_cost.py --src DIR        # another checkout's kvstudy (e.g. a git worktree of an older
                                                 # commit); a combination it lacks is marked

Each configuration runs 5 times in this process (Vidur latency, LMSYS-like requests at λ = 50, Llama2-70B on
a100_tp2); the best simulate time is divided by the iterations. Runs of the two checkouts should be made
back to back: this machine's speed drifts by ±30% over minutes.
"""
import sys

CONFIGS = [["+policy=mcsf", "+demand=high"], ["+policy=mc_benchmark", "+demand=high"],
           ["+policy=alpha_greedy", "+demand=high"], ["+policy=mcsf", "+demand=high", "memory=paged"],
           ["+policy=vllm", "+demand=high"], ["+policy=sarathi", "+demand=high"], ["+policy=rr_sjf", "+demand=high"],
           ["+policy=cacheopt", "+demand=high"]]


def main(argv):
    if "--src" in argv:
        sys.path.insert(0, argv[argv.index("--src") + 1])
    from kvstudy import api
    from kvstudy.errors import KvStudyError

    print("| config | requests | iterations | best simulate s | µs per iteration |")
    print("|---|---|---|---|---|")
    for overrides in CONFIGS:
        for n in (1000, 5000):
            try:
                cfg = api.compose(overrides + ["engine.progress=false", f"workload.num_requests={n}"])
                best, its = None, 0
                for _ in range(5):
                    res, summary = api.simulate(cfg)
                    best = summary["simulate_seconds"] if best is None else min(best, summary["simulate_seconds"])
                    its = len(res.iterations)
            except KvStudyError as exc:  # an older checkout without this combination
                print(f"| {' '.join(overrides)} | {n} | — | — | not in this checkout ({str(exc)[:60]}) |", flush=True)
                continue
            print(f"| {' '.join(overrides)} | {n} | {its} | {best:.3f} | {best / its * 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
