"""Engine cost per iteration: the paper loop (memory=paper) and the preemptive loop (memory=paged).

    python bench/engine_cost.py                  # this checkout
    python bench/engine_cost.py --src DIR        # another checkout's kvstudy (e.g. a git worktree of an older
                                                 # commit), paper policies only if it has no paged memory

Each configuration runs 5 times in this process (Vidur latency, LMSYS-like requests at λ = 50, Llama2-70B on
a100_tp2); the best simulate time is divided by the iterations. Runs of the two checkouts should be made
back to back: this machine's speed drifts by ±30% over minutes.
"""
import sys

CONFIGS = [["+policy=mcsf", "+demand=high"], ["+policy=alpha_greedy", "+demand=high"],
           ["+policy=vllm", "+demand=high"], ["+policy=sarathi", "+demand=high"]]


def main(argv):
    if "--src" in argv:
        sys.path.insert(0, argv[argv.index("--src") + 1])
    from kvstudy import api

    has_paged = "vllm" in api.options("policy")
    print("| config | requests | iterations | best simulate s | µs per iteration |")
    print("|---|---|---|---|---|")
    for overrides in CONFIGS:
        if "+policy=vllm" in overrides or "+policy=sarathi" in overrides:
            if not has_paged:
                continue
        for n in (1000, 5000):
            cfg = api.compose(overrides + ["engine.progress=false", f"workload.num_requests={n}"])
            best, its = None, 0
            for _ in range(5):
                res, summary = api.simulate(cfg)
                best = summary["simulate_seconds"] if best is None else min(best, summary["simulate_seconds"])
                its = len(res.iterations)
            print(f"| {' '.join(overrides)} | {n} | {its} | {best:.3f} | {best / its * 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
