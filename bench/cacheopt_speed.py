"""CacheOPT's scheduler cost per iteration against the baselines' (issue 33, item 6; the paper's Fig. 16 overhead).

    python bench/cacheopt_speed.py [REQUESTS] [OTHER_CHECKOUT]

Runs vLLM, Sarathi, RLP, S3 and CacheOPT on the main comparison's setting (OPT-13B / one A100, ShareGPT at three
rates around the knee, seed 0) and prints the engine's ``policy_us_per_iteration`` (wall time inside
``policy.step``, divided by the iterations), best of three fresh processes each, and CacheOPT's ratio to vLLM.
With OTHER_CHECKOUT (a kvstudy checkout, e.g. the commit before the speed-up), CacheOPT is also run from that
code, back to back with this one, so the two are measured under the same load.
"""
import json
import os
import subprocess
import sys

RATES = (0.2, 0.22, 0.25)
SYSTEMS = ("vllm", "sarathi", "rlp", "s3", "cacheopt")


def one(policy: str, scale: float, n: int, pythonpath=None) -> dict:
    code = ("import json,sys; from kvstudy import api; cfg = api.compose(sys.argv[1:]); res, _ = api.simulate(cfg); "
            "print(json.dumps({'us': res.extra['policy_us_per_iteration'], 'iterations': len(res.iterations)}))")
    args = [sys.executable, "-c", code, "+experiment=cacheopt_main", f"+policy={policy}", f"demand.scale={scale}",
            "workload=sharegpt", f"workload.num_requests={n}", "seed=0"]
    env = dict(os.environ, **({"PYTHONPATH": pythonpath} if pythonpath else {}))
    out = subprocess.run(args, capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def best(policy, scale, n, pythonpath=None, tries=3):
    runs = [one(policy, scale, n, pythonpath) for _ in range(tries)]
    return min(r["us"] for r in runs), runs[0]["iterations"]


def main(n: int, other=None) -> None:
    head = ["rate scale"] + [f"{s} us/it" for s in SYSTEMS] + (["cacheopt (other checkout) us/it"] if other else []) + \
        ["cacheopt / vllm"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for scale in RATES:
        cells, us = [], {}
        for system in SYSTEMS:
            us[system], _ = best(system, scale, n)
            cells.append(f"{us[system]:.1f}")
        if other:
            cells.append(f"{best('cacheopt', scale, n, other)[0]:.1f}")
        cells.append(f"{us['cacheopt'] / us['vllm']:.0f}x")
        print(f"| {scale} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000, sys.argv[2] if len(sys.argv) > 2 else None)
