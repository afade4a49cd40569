"""Per-iteration cost of policies relative to the first one (issue 47's "MC-SF within 3x of alpha-greedy", "CacheOPT
within 10x of vLLM"): each policy in a fresh process, LMSYS-like requests at lambda = 50 (``+demand=high``), Vidur
latency, the engine loop's seconds (``simulate_seconds``) over its iterations; the policies interleaved, ROUNDS
rounds, the best of each (this machine drifts by +-30% within minutes).

    python bench/policy_ratio.py REQUESTS POLICY,POLICY,... [ROUNDS] [extra overrides]
    python bench/policy_ratio.py 40000 alpha_greedy,mcsf,mc_benchmark 3
    python bench/policy_ratio.py 20000 vllm,cacheopt 3
"""
import json
import subprocess
import sys

CODE = r'''
import sys, json
from kvstudy import api
res, s = api.simulate(api.compose(sys.argv[1:]))
print(json.dumps({"us": 1e6 * s["simulate_seconds"] / len(res.iterations), "iterations": len(res.iterations),
                  "status": s["status"], "policy_us": s.get("policy_us_per_iteration")}))
'''


def main(argv) -> int:
    n, policies = argv[0], argv[1].split(",")
    rounds = int(argv[2]) if len(argv) > 2 else 3
    extra = argv[3:]
    best, its, inside = {}, {}, {}
    for _ in range(rounds):
        for p in policies:
            args = [f"+policy={p}", "+demand=high", f"workload.num_requests={n}", "engine.progress=false", *extra]
            out = subprocess.run([sys.executable, "-c", CODE, *args], capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"{p}: {out.stderr.strip().splitlines()[-1]}")
            d = json.loads(out.stdout.strip().splitlines()[-1])
            if d["us"] < best.get(p, float("inf")):
                best[p], inside[p] = d["us"], d["policy_us"]
            its[p] = d["iterations"]
    print(f"| policy | iterations | µs per iteration (best of {rounds}) | vs {policies[0]} | of which the policy's own "
          f"step, µs (paged memory only) |")
    print("|---|---|---|---|---|")
    for p in policies:
        own = "" if inside[p] is None else f"{inside[p]:.1f}"
        print(f"| {p} | {its[p]:,} | {best[p]:.1f} | {best[p] / best[policies[0]]:.2f}x | {own} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
