"""Wall time, cost per iteration and peak memory against the number of requests (issue 27).

    python bench/scale.py                                   # LMSYS-like at lambda = 50: 10^3 .. 10^5, four policies
    python bench/scale.py --sizes 1000,1000000 --policies mcsf
    python bench/scale.py --traces                          # the shared Splitwise traces, full size
    python bench/scale.py --trace my.csv [--columns arrival_time=ts,prompt_tokens=in,output_tokens=out]
    python bench/scale.py --src DIR                         # another checkout (a git worktree of an older commit)
    python bench/scale.py --vidur                           # also Vidur's own simulator per size (see below)
    python bench/scale.py --policies main --sizes 1000,10000,100000,1000000 --budget 300   # issue 47's table

``--policies main``: every built-in policy except CacheOPT's ablation variants (``cacheopt_*``, the same code with
a feature off). ``--budget S``: a policy whose simulate time at one size, scaled by the next size's share, exceeds S
seconds is not run at the next size (printed as skipped, with that estimate): a run known to miss the budget is not
waited for. Every configuration runs in a fresh child process (so peak RSS is its own), with Vidur's trained predictor
(Llama2-70B on a100_tp2, M = 16,492), `engine.progress=false`. Reported: the simulation's wall time
(`simulate_seconds`: the engine loop, without set-up), microseconds per iteration, the child's peak RSS, and
the run's status. `--timeout S` (default 900) abandons a configuration; it is printed as a timeout. Runs of
two checkouts should be made back to back: this machine's speed drifts by +-30% over minutes. `wall s` is the whole
`api.simulate` call: for CacheOPT it includes the runs of its SLO reference systems (vLLM, RLP, S3, Sarathi on the
same requests, spec B8.12) before its own, so at 10^6 requests it needs a `--timeout` of about 900 s. `--vidur` times
Vidur's simulator with its vLLM scheduler on LMSYS-like requests at lambda = 10 (bench/vs_vidur.py's set-up, the
like-for-like comparison with kvstudy's `vllm` policy is `python bench/vs_vidur.py speed`): Vidur has no MC-SF.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1]) if sys.argv[1] else None
from kvstudy import api
cfg = api.compose(json.loads(sys.argv[2]))
t0 = time.perf_counter()
result, summary = api.simulate(cfg)
wall = time.perf_counter() - t0
print(json.dumps({"simulate_seconds": summary["simulate_seconds"], "total_seconds": wall,
                  "iterations": len(result.iterations), "status": summary["status"],
                  "completed": summary["completed"], "num_requests": summary["num_requests"], "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def child(src: str, overrides, timeout: float) -> dict:
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, src, json.dumps(overrides)], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout ({timeout:.0f} s)"}
    if proc.returncode != 0:
        return {"status": "error: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:120]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def vidur_run(n: int, timeout: float) -> dict:
    """Vidur's own simulator (vLLM scheduler) on the same LMSYS-like requests (bench/vs_vidur.py's set-up)."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys, json, time; sys.path.insert(0, {here!r}); import vs_vidur; t=time.perf_counter(); "
            f"r = vs_vidur.one('vidur', 'lmsys', {n}, 'vllm', 'vidur'); print(json.dumps({{'wall': time.perf_counter()-t}}))")
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout ({timeout:.0f} s)"}
    if proc.returncode != 0:
        return {"status": "error: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:120]}
    return {"status": "completed", "wall": time.perf_counter() - start}


def row(label, n, res):
    if "simulate_seconds" not in res:
        print(f"| {label} | {n:,} | | | | | {res['status']} |", flush=True)
        return
    per_it = res["simulate_seconds"] / max(res["iterations"], 1) * 1e6
    print(f"| {label} | {n:,} | {res['simulate_seconds']:.2f} | {res['total_seconds']:.2f} | {per_it:.1f} | "
          f"{res['peak_mb']:.0f} | {res['status']} ({res['completed']:,} done, {res['iterations']:,} iterations) |",
          flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default="", help="another checkout's root (its kvstudy/ is imported)")
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--policies", default="mcsf,mc_benchmark,alpha_greedy,alpha_beta")
    ap.add_argument("--traces", action="store_true", help="the shared Splitwise conversation and code traces")
    ap.add_argument("--trace", action="append", default=[], help="a trace file (any number of times)")
    ap.add_argument("--columns", default="", help="column map for --trace, e.g. arrival_time=ts,prompt_tokens=in")
    ap.add_argument("--vidur", action="store_true", help="also time Vidur's simulator on the LMSYS-like sizes")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--budget", type=float, default=0.0, help="skip a policy at the next size when its time at this "
                                                                  "size, scaled up, exceeds this many seconds")
    args = ap.parse_args(argv)
    if args.policies == "main":
        from kvstudy import api

        args.policies = ",".join(p for p in api.options("policy") if not p.startswith("cacheopt_"))
    policies = [p for p in args.policies.split(",") if p]
    last = {}  # policy -> (requests, simulate seconds) of its last completed size
    print("| config | requests | simulate s | wall s | µs per iteration | peak MB | status |")
    print("|---|---|---|---|---|---|---|")
    if not (args.traces or args.trace):
        for n in (int(x) for x in args.sizes.split(",")):
            for policy in policies:
                label = f"{policy}, LMSYS-like, λ = 50"
                if args.budget and policy in last and last[policy][1] * n / last[policy][0] > args.budget:
                    m, secs = last[policy]
                    print(f"| {label} | {n:,} | | | | | skipped: {secs:.1f} s at {m:,} scales to "
                          f"{secs * n / m:.0f} s > {args.budget:.0f} s |", flush=True)
                    last[policy] = (n, secs * n / m)
                    continue
                res = child(args.src, [f"+policy={policy}", "+demand=high", f"workload.num_requests={n}",
                                       "engine.progress=false"], args.timeout)
                row(label, n, res)
                if "simulate_seconds" in res:
                    last[policy] = (n, res["simulate_seconds"])
                else:  # a timeout or an error: nothing larger is tried
                    last[policy] = (n, float("inf"))
            if args.vidur:
                res = vidur_run(n, args.timeout)
                print(f"| Vidur simulator (vllm), LMSYS-like, λ = 10 | {n:,} | {res.get('wall', float('nan')):.2f} (whole run) "
                      f"| | | {res['status']} |", flush=True)
    traces = list(args.trace)
    columns = [f"workload.columns.{kv}" for kv in args.columns.split(",") if kv]
    if args.traces:
        from kvstudy.running.paths import SHARED_REFERENCE

        folder = SHARED_REFERENCE / "vidur-data" / "traces"
        if not folder.exists():
            print(f"no shared traces at {folder}: skipped")
        else:
            traces += [str(folder / "splitwise_conv.csv"), str(folder / "splitwise_code.csv")]
            # Llama2-70B's context is 4,096 tokens; these traces hold longer prompts: dropped (and counted in a warning)
            columns = ["workload.columns.arrival_time=arrived_at", "workload.columns.prompt_tokens=num_prefill_tokens",
                       "workload.columns.output_tokens=num_decode_tokens", "workload.drop_over_context=true"]
    for path in traces:
        for policy in policies:
            res = child(args.src, [f"+policy={policy}", "workload=trace", f"workload.path={path}",
                                   "engine.progress=false", *columns], args.timeout)
            row(f"{policy}, {os.path.basename(path)} (its timestamps)", res.get("num_requests", 0) or 0, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
