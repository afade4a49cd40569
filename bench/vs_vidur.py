"""kvstudy vs Vidur's own simulator on the same requests, model, hardware, profiles and trained predictor.

    python bench/vs_vidur.py agree [N]   # agreement tables: vllm and sarathi vs Vidur's, N=10,000 requests of
                                         # Splitwise conv (overload) and LMSYS-like at 10 req/s (moderate load)
    python bench/vs_vidur.py spread [N] [SEEDS]   # the moderate-load gaps over LMSYS-like seeds (default 0-4)
    python bench/vs_vidur.py speed [WORKLOAD:N[:REPLICAS] ...] [--router=R] [--scheduler=S]   # speed: kvstudy vs
                                         # Vidur, scheduler S (vllm, the default, or sarathi) on both (default 1k-100k,
                                         # one replica; R one of round_robin, random, lor)
    python bench/vs_vidur.py cluster [N] [REPLICAS] [WORKLOAD ...]   # issue 37: N requests (10,000) on REPLICAS (4)
                                         # replicas behind Vidur's three global schedulers and kvstudy's routers
    python bench/vs_vidur.py pp [N] [PP ...] [WORKLOAD ...]   # issue 58: pipeline parallelism, N requests (3,000) on
                                         # a100_tp2 with PP stages (2 and 4), KV per stage as at PP=1
    python bench/vs_vidur.py --one ENGINE WORKLOAD N SCHEDULER MODE   (internal: one run in a fresh process)

Both sides: Llama2-70B on a100_tp2, KV capacity 16,492 tokens in blocks of 16 (1,030 blocks), watermark 1%,
vLLM token budget 4,096, Sarathi chunk 512, recompute preemption. kvstudy runs ``memory=paged`` with
policy ``vllm`` or ``sarathi`` in three settings:

* ``vllm_semantics``: vLLM V0 as kvstudy implements it (running list in admission order, max_num_seqs 256,
  the predictor keyed on each request's cached context, a free block at every decode's turn:
  ``memory.decode_block_check=vllm``, the default);
* ``boundary``: the same with ``memory.decode_block_check=boundary`` (a free block only at a block boundary,
  kvstudy's default before issue 33);
* ``aligned``: the named differences set to Vidur's: running list sorted by arrival before each step
  (Vidur's replica schedulers sort their preempted list), at most 128 requests holding KV (Vidur's
  batch_size_cap), and the predictor keyed as Vidur's simulator keys it (``VidurKeys``). (Vidur 0.0.26's
  vLLM scheduler sums a batch's query tokens against ``max_tokens_in_batch``, as vLLM does; older Vidur code
  counted batch size x the longest request, which 0.0.26 no longer does, so there is nothing to align there.)
* ``swap``: vLLM semantics with swap preemption (Vidur has no swap; no Vidur row to compare).

Each measurement runs in its own process; peak memory is the process's resident-set high-water mark.
"""
import json
import subprocess
import sys
import tempfile
import time

import numpy as np

CAPACITY = 16492
BLOCK = 16
VIDUR_CAP = 128
TOKENS_IN_BATCH = 4096
CHUNK = 512


class VidurKeys:
    """Vidur 0.0.26's simulator keys attention on ``num_kv_tokens = processed + q`` (its vllm/sarathi
    schedulers), where kvstudy passes the context cached before the iteration: a prefill chunk c over k
    cached tokens is keyed on k + c, and a decode (Vidur counts the token from the prefill as processed)
    on the cached context + 2. This wrapper feeds kvstudy's latency model the keys Vidur's simulator uses."""

    def __init__(self, inner):
        self.inner = inner
        self.stamps_at_start = False

    def iteration_seconds(self, chunks, num_decodes, decode_context_sum):
        return self.inner.iteration_seconds([(c, k + c) for c, k in chunks], num_decodes,
                                            decode_context_sum + 2 * num_decodes)

    def decode_run_seconds(self, num_decodes, decode_context_sum, count):
        return self.inner.decode_run_seconds(num_decodes, decode_context_sum + 2 * num_decodes, count)

    @property
    def stages(self):
        return self.inner.stages

    def hop_seconds(self, tokens):
        return self.inner.hop_seconds(tokens)

    def describe(self):
        return {**self.inner.describe(), "keys": "vidur"}


def requests(workload: str, n: int, replicas: int = 1):
    from kvstudy.running.paths import SHARED_REFERENCE
    from kvstudy.workloads.arrivals import poisson
    from kvstudy.workloads.lmsys import lmsys
    import pandas as pd

    if workload == "splitwise_conv":
        df = pd.read_csv(SHARED_REFERENCE / "vidur-data/traces/splitwise_conv.csv")
        df = df[df.num_prefill_tokens + df.num_decode_tokens <= 4096].iloc[:n]
        return df.arrived_at.to_numpy() - df.arrived_at.min(), df.num_prefill_tokens.to_numpy(), df.num_decode_tokens.to_numpy()
    # "lmsys" is seed 0; "lmsys:K" draws the lengths and arrivals with seed K (the spread between seeds)
    rng = np.random.default_rng(int(workload.split(":")[1]) if ":" in workload else 0)
    lengths = lmsys(n, rng, max_model_len=4096)
    # 10 req/s per replica: the same moderate load on each replica of a cluster
    return poisson(n, 10.0 * replicas, rng), lengths.prompt_tokens.to_numpy(), lengths.output_tokens.to_numpy()


def _status_mb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024


def _stats(arrival, first, completion, restarts):
    e2e = np.asarray(completion) - np.asarray(arrival)
    ttft = np.asarray(first) - np.asarray(arrival)
    return {"makespan": float(np.nanmax(completion) - np.min(arrival)), "median_e2e": float(np.nanmedian(e2e)),
            "p99_e2e": float(np.nanpercentile(e2e, 99)), "median_ttft": float(np.nanmedian(ttft)),
            "p99_ttft": float(np.nanpercentile(ttft, 99)), "preemptions": int(np.sum(restarts)),
            "completed": int(np.isfinite(completion).sum())}


#: Vidur's global schedulers and kvstudy's routers with their semantics (kvstudy/cluster/routers.py)
ROUTER_NAMES = {"round_robin": "round_robin", "random": "random", "lor": "least_outstanding"}


def one(engine: str, workload: str, n: int, scheduler: str, mode: str, replicas: int = 1,
        router: str = "round_robin", pp: int = 1) -> dict:
    from kvstudy import api
    from kvstudy.latency.models import profile_files

    arrival, prompt, output = requests(workload, n, replicas)
    overrides = [f"+policy={scheduler}", "engine.progress=false", f"memory.capacity_tokens={CAPACITY}",
                 f"memory.block_size={BLOCK}", f"hardware.pipeline_parallel={pp}"]
    if scheduler == "vllm":
        overrides.append(f"policy.max_num_batched_tokens={TOKENS_IN_BATCH}")
    else:
        overrides.append(f"policy.chunk_size={CHUNK}")
    if mode == "aligned":
        overrides += ["policy.running_order=arrival", f"policy.max_num_seqs={VIDUR_CAP}"]
    if mode == "swap":
        overrides.append("policy.preemption_mode=swap")
    if mode == "boundary":
        overrides.append("memory.decode_block_check=boundary")
    cfg = api.compose(overrides)
    arch, hw, capacity, latency = api.model_setup(cfg)
    if engine == "kvstudy":
        from kvstudy.workloads.requests import make_requests

        if mode == "aligned":
            latency = VidurKeys(latency)
        req = make_requests(arrival, prompt, output, source=workload)
        engines = []
        for k in range(replicas):
            policy = api.build_policy(cfg)
            policy.reset(k)
            engines.append(api.build_engine(cfg, req, req.output_tokens, policy, latency, arch, hw, capacity))
        t0 = time.perf_counter()
        if replicas == 1:
            res = engines[0].run()
        else:
            from kvstudy.cluster.driver import drive, merge
            from kvstudy.cluster.routers import ROUTERS

            chosen = ROUTERS[ROUTER_NAMES[router]]()
            chosen.reset(0)  # Vidur's runs use seed 0: its random router draws the same stream
            results, routed = drive(engines, chosen, req.arrival_time.tolist())
            res = merge(engines, results, routed, chosen.name)
        run_s = time.perf_counter() - t0
        q = res.requests
        out = {"run_seconds": run_s, "iterations": len(res.iterations), "status": res.status,
               **_stats(q.arrival_time, q.first_token_time, q.completion_time, q.preemptions)}
        if replicas > 1:
            out["replica"] = q.replica.tolist()
    else:
        from kvstudy.latency import vidur_adapter
        from kvstudy.latency.models import vidur_cache_folder

        folder = str(vidur_cache_folder(latency.info["cache_key"]) / "vidur")
        with tempfile.TemporaryDirectory() as work:
            files = profile_files(arch, hw)
            res = vidur_adapter.run_vidur_simulator(
                arch, hw, files, latency.settings, folder, arrival, prompt, output, CAPACITY, work,
                max_tokens_in_batch=TOKENS_IN_BATCH, batch_size_cap=VIDUR_CAP, scheduler=scheduler,
                chunk_size=CHUNK, block_size=BLOCK, per_request=True, num_replicas=replicas, global_scheduler=router)
        q = res.pop("requests")
        out = {**res, **_stats(q["arrival"], q["first_token"], q["completion"], q["restarts"])}
        if replicas > 1:
            out["replica"] = q["replica"]
    out["run_peak_mb"] = _status_mb("VmHWM")
    out.update(engine=engine, workload=workload, n=n, scheduler=scheduler, mode=mode, replicas=replicas, router=router,
               pp=pp)
    return out


def measure(engine, workload, n, scheduler="vllm", mode="vllm_semantics", timeout=3600, replicas=1,
            router="round_robin", pp=1):
    t0 = time.perf_counter()
    args = [sys.executable, __file__, "--one", engine, workload, str(n), scheduler, mode, str(replicas), router,
            str(pp)]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"engine": engine, "workload": workload, "n": n, "run_seconds": None, "note": f"> {timeout} s"}
    if proc.returncode:
        return {"engine": engine, "workload": workload, "n": n, "run_seconds": None, "note": proc.stderr[-300:]}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_seconds"] = time.perf_counter() - t0
    return res


def _pct(a, b):
    return f"{100 * (a - b) / b:+.1f}%" if b else "n/a"


WORKLOADS = {"splitwise_conv": "Splitwise conversation trace, first {n} requests (prompt + output <= 4,096), at "
                                "its own arrival times (deep overload: makespan is throughput)",
             "lmsys": "LMSYS-like lengths, {n} requests, Poisson at 10 req/s per replica (moderate load)"}


def agree(n: int, workloads=("splitwise_conv", "lmsys")) -> None:
    for workload in workloads:
        rows = []
        for scheduler in ("vllm", "sarathi"):
            vidur = measure("vidur", workload, n, scheduler, "vidur")
            print(json.dumps(vidur), flush=True)
            for mode in ("vllm_semantics", "boundary", "aligned", "swap"):
                k = measure("kvstudy", workload, n, scheduler, mode)
                print(json.dumps(k), flush=True)
                rows.append((scheduler, mode, k, vidur))
        print(f"\n{WORKLOADS[workload].format(n=n)}; Llama2-70B, a100_tp2, {CAPACITY} tokens in blocks of {BLOCK}\n")
        print("| scheduler | kvstudy setting | makespan s (Vidur) | median e2e s (Vidur) | p99 e2e s (Vidur) | "
              "median TTFT s (Vidur) | p99 TTFT s (Vidur) | preemptions (Vidur) | run s (Vidur) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for scheduler, mode, k, v in rows:
            if not k.get("run_seconds") or not v.get("run_seconds"):
                print(f"| {scheduler} | {mode} | failed: {k.get('note') or v.get('note')} |")
                continue
            cells = [f"{k[m]:.2f} ({v[m]:.2f}; {_pct(k[m], v[m])})" for m in
                     ("makespan", "median_e2e", "p99_e2e", "median_ttft", "p99_ttft")]
            print(f"| {scheduler} | {mode} | " + " | ".join(cells) +
                  f" | {k['preemptions']} ({v['preemptions']}; {_pct(k['preemptions'], v['preemptions'])}) | "
                  f"{k['run_seconds']:.2f} ({v['run_seconds']:.2f}; {v['run_seconds'] / k['run_seconds']:.1f}x) |",
                  flush=True)


def _pair(workload: str, n: int, scheduler: str, modes, key: tuple, **where) -> list:
    """Vidur's run and kvstudy's in each of ``modes`` at the same settings (``where``: replicas, router, pp), each
    printed as a JSON line (without the per-request replica list); rows of (*key, mode, kvstudy's, Vidur's)."""
    v = measure("vidur", workload, n, scheduler, "vidur", **where)
    print(json.dumps({x: y for x, y in v.items() if x != "replica"}), flush=True)
    rows = []
    for mode in modes:
        k = measure("kvstudy", workload, n, scheduler, mode, **where)
        print(json.dumps({x: y for x, y in k.items() if x != "replica"}), flush=True)
        rows.append((*key, mode, k, v))
    return rows


def _table(header: list, rows: list, metrics: tuple, extra) -> None:
    """A Markdown table of ``_pair``'s rows: the row's key and mode, each metric as kvstudy (Vidur; difference), then
    ``extra(kvstudy's, Vidur's)``'s cells."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for *key, mode, k, v in rows:
        lead = " | ".join(str(x) for x in (*key, mode))
        if not k.get("run_seconds") or not v.get("run_seconds"):
            print(f"| {lead} | failed: {k.get('note') or v.get('note')} |")
            continue
        cells = [f"{k[m]:.2f} ({v[m]:.2f}; {_pct(k[m], v[m])})" for m in metrics] + extra(k, v)
        print(f"| {lead} | " + " | ".join(cells) + " |", flush=True)


def pipeline(n: int = 3000, stages=(2, 4), workloads=("splitwise_conv", "lmsys"),
             modes=("vllm_semantics", "aligned")) -> None:
    """Issue 58: pipeline parallelism against Vidur's own simulator. Llama2-70B on a100_tp2 with ``stages`` pipeline
    stages (2x2 and 4x2 A100s), the KV capacity per stage kept at PP=1's (16,492 tokens), vLLM and Sarathi; makespan,
    median TTFT and median e2e per stage count, with PP=1 as the reference row."""
    for workload in workloads:
        rows = []
        for pp in (1, *stages):
            for scheduler in ("vllm", "sarathi"):
                rows += _pair(workload, n, scheduler, modes, (pp, scheduler), pp=pp)
        print(f"\n{WORKLOADS[workload].format(n=n)}; Llama2-70B, a100_tp2 x PP stages, {CAPACITY} tokens in blocks of "
              f"{BLOCK}\n")
        _table(["PP", "scheduler", "kvstudy setting", "makespan s (Vidur)", "median TTFT s (Vidur)",
                "median e2e s (Vidur)", "run s (Vidur)"], rows, ("makespan", "median_ttft", "median_e2e"),
               lambda k, v: [f"{k['run_seconds']:.2f} ({v['run_seconds']:.2f})"])


def cluster(n: int, replicas: int = 4, workloads=("splitwise_conv",), modes=("vllm_semantics", "aligned")) -> None:
    """Issue 37: ``replicas`` replicas behind Vidur's round_robin, random and lor global schedulers and kvstudy's
    round_robin, random and least_outstanding routers; the replica schedulers vLLM and Sarathi. ``same replica``:
    the share of requests both simulators sent to the same replica (1.0 for the load-blind routers, which see the
    same arrival order and, for random, the same seeded stream)."""
    for workload in workloads:
        rows = []
        for scheduler in ("vllm", "sarathi"):
            for router in ROUTER_NAMES:
                rows += _pair(workload, n, scheduler, modes, (scheduler, router), replicas=replicas, router=router)
        print(f"\n{WORKLOADS[workload].format(n=n)}; {replicas} replicas of Llama2-70B on a100_tp2, {CAPACITY} tokens "
              f"each in blocks of {BLOCK}\n")
        def extra(k, v):
            same = float(np.mean(np.asarray(k["replica"]) == np.asarray(v["replica"])))
            return [f"{k['preemptions']} ({v['preemptions']})", f"{same:.3f}",
                    f"{k['run_seconds']:.2f} ({v['run_seconds']:.2f}; {v['run_seconds'] / k['run_seconds']:.1f}x)"]

        _table(["scheduler", "router", "kvstudy setting", "makespan s (Vidur)", "median e2e s (Vidur)",
                "p99 e2e s (Vidur)", "median TTFT s (Vidur)", "preemptions (Vidur)", "same replica", "run s (Vidur)"],
               rows, ("makespan", "median_e2e", "p99_e2e", "median_ttft"), extra)


def spread(n: int, seeds=(0, 1, 2, 3, 4)) -> None:
    """kvstudy's gap to Vidur per LMSYS-like seed (lengths and arrivals drawn with that seed) at 10 req/s: a gap
    that changes sign between seeds is the chaos of a knife-edge metric, not a modelling difference."""
    metrics = ("makespan", "median_e2e", "p99_e2e", "median_ttft", "p99_ttft", "preemptions")
    gaps = {}
    for seed in seeds:
        workload = f"lmsys:{seed}"
        for scheduler in ("vllm", "sarathi"):
            v = measure("vidur", workload, n, scheduler, "vidur")
            for mode in ("vllm_semantics", "aligned"):
                k = measure("kvstudy", workload, n, scheduler, mode)
                for m in metrics:
                    gaps.setdefault((scheduler, mode, m), []).append(100 * (k[m] - v[m]) / v[m] if v[m] else np.nan)
                print(json.dumps({"seed": seed, "scheduler": scheduler, "mode": mode,
                                  **{m: round(gaps[(scheduler, mode, m)][-1], 1) for m in metrics}}), flush=True)
    print(f"\nLMSYS-like lengths, {n} requests, Poisson at 10 req/s, seeds {', '.join(map(str, seeds))}: kvstudy vs "
          f"Vidur, gap in % as mean [min, max] over the seeds\n")
    print("| scheduler | kvstudy setting | " + " | ".join(metrics) + " |")
    print("|---|---|" + "---|" * len(metrics))
    for scheduler in ("vllm", "sarathi"):
        for mode in ("vllm_semantics", "aligned"):
            cells = [gaps[(scheduler, mode, m)] for m in metrics]
            print(f"| {scheduler} | {mode} | " + " | ".join(
                f"{np.mean(g):+.1f} [{np.min(g):+.1f}, {np.max(g):+.1f}]" for g in cells) + " |")


def speed(plan=None, router: str = "round_robin", scheduler: str = "vllm") -> None:
    """kvstudy (best of 3) and Vidur (once) back to back for each size: the machine's speed drifts. A plan entry is
    (workload, requests[, replicas]); several replicas sit behind ``router`` (Vidur's name); ``scheduler`` vllm or
    sarathi on both sides."""
    plan = plan or [("splitwise_conv", 1000), ("splitwise_conv", 10000), ("lmsys", 1000), ("lmsys", 10000),
                    ("lmsys", 100000)]
    print(f"| workload | requests | replicas | kvstudy {scheduler} run s | Vidur {scheduler} run s | speed-up | "
          f"kvstudy peak RSS MB | Vidur peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for workload, n, *rest in plan:
        replicas = rest[0] if rest else 1
        # kvstudy's runs are short and noisy: best of three fresh processes; Vidur's long runs once
        tries = [measure("kvstudy", workload, n, scheduler, "aligned", replicas=replicas, router=router)
                 for _ in range(3)]
        ok = [t for t in tries if t.get("run_seconds")]
        k = min(ok, key=lambda t: t["run_seconds"]) if ok else tries[0]
        v = measure("vidur", workload, n, scheduler, "vidur", replicas=replicas, router=router)
        ratio = v["run_seconds"] / k["run_seconds"] if k.get("run_seconds") and v.get("run_seconds") else None
        fmt = lambda x, f="{:.2f}": f.format(x) if isinstance(x, (int, float)) else str(x)
        print(f"| {workload} | {n} | {replicas} | {fmt(k.get('run_seconds'))} | {fmt(v.get('run_seconds') or v.get('note'))} | "
              f"{fmt(ratio, '{:.1f}x')} | {fmt(k.get('run_peak_mb'), '{:.0f}')} | {fmt(v.get('run_peak_mb'), '{:.0f}')} |",
              flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6],
                             *([int(sys.argv[7]), sys.argv[8]] if len(sys.argv) > 8 else []),
                             *([int(sys.argv[9])] if len(sys.argv) > 9 else []))))
    elif len(sys.argv) > 1 and sys.argv[1] == "pp":
        rest = sys.argv[3:]
        pipeline(int(sys.argv[2]) if len(sys.argv) > 2 else 3000, tuple(int(a) for a in rest if a.isdigit()) or (2, 4),
                 tuple(a for a in rest if not a.isdigit()) or ("splitwise_conv", "lmsys"))
    elif len(sys.argv) > 1 and sys.argv[1] == "cluster":
        cluster(int(sys.argv[2]) if len(sys.argv) > 2 else 10000, int(sys.argv[3]) if len(sys.argv) > 3 else 4,
                tuple(sys.argv[4:]) or ("splitwise_conv",))
    elif len(sys.argv) > 1 and sys.argv[1] == "spread":
        spread(int(sys.argv[2]) if len(sys.argv) > 2 else 10000,
               tuple(int(x) for x in sys.argv[3].split(",")) if len(sys.argv) > 3 else (0, 1, 2, 3, 4))
    elif len(sys.argv) > 1 and sys.argv[1] == "speed":
        # e.g. splitwise_conv:10000, or splitwise_conv:10000:4 (4 replicas); --router=lor (default round_robin)
        # --scheduler=sarathi (default vllm)
        routers = [a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--router=")]
        schedulers = [a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--scheduler=")]
        sizes = [(p[0], *map(int, p[1:])) for p in (a.split(":") for a in sys.argv[2:] if not a.startswith("--"))]
        speed(sizes or None, (routers or ["round_robin"])[0], (schedulers or ["vllm"])[0])
    else:
        agree(int(sys.argv[2]) if len(sys.argv) > 2 else 10000, tuple(sys.argv[3:]) or ("splitwise_conv", "lmsys"))
