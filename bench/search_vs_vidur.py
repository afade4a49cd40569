"""Issue 58's agreement check: a deployment's capacity under Vidur-Search's criterion (scheduling delay p99 at most 2 s),
found by kvstudy's bisection (kvstudy/search/capacity.py ``search_rate``) over kvstudy's simulator and over Vidur's own
simulator on the same requests, model, hardware, profiles and trained predictor (bench/vs_vidur.py's settings, the
``aligned`` mode), and the wall time of each search.

    python bench/search_vs_vidur.py [N] [HARDWARE[:ppK] ...]   # N Splitwise conversation requests (default 1,000),
                                                         # hardware options (default a100_tp2 a100_tp4), each with
                                                         # K pipeline stages when suffixed :ppK (a100_tp2:pp2)

Prints one Markdown row per deployment (hardware x PP x vLLM / Sarathi with chunks of 256 and 512): both capacities,
their difference, both searches' simulations and seconds, then the ranking of each side, whether the top 3 agree,
and both searches' wall time in all with their ratio. Pipeline stages run as Vidur runs them (kvstudy/engine/
pipeline.py), with the KV capacity per stage kept at 16,492 tokens as at PP=1 (bench/vs_vidur.py's setting).
"""
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from vs_vidur import BLOCK, CAPACITY, TOKENS_IN_BATCH, VIDUR_CAP, VidurKeys  # noqa: E402

QUANTILE, SECONDS, TOLERANCE = 0.99, 2.0, 0.02


def lengths(n):
    import pandas as pd

    from kvstudy.running.paths import SHARED_REFERENCE

    df = pd.read_csv(SHARED_REFERENCE / "vidur-data/traces/splitwise_conv.csv")
    df = df[df.num_prefill_tokens + df.num_decode_tokens <= 4096].iloc[:n]
    return df.num_prefill_tokens.to_numpy(), df.num_decode_tokens.to_numpy()


def delay_p99(arrival, scheduled):
    delay = np.asarray(scheduled, dtype=float) - np.asarray(arrival, dtype=float)
    delay[np.isnan(delay)] = np.inf
    return float(np.quantile(delay, QUANTILE))


def setup(hardware, scheduler, chunk):
    from kvstudy import api

    hardware, _, pp = hardware.partition(":pp")
    overrides = [f"hardware={hardware}", f"hardware.pipeline_parallel={int(pp or 1)}", f"+policy={scheduler}", "engine.progress=false",
                 f"memory.capacity_tokens={CAPACITY}", f"memory.block_size={BLOCK}", "policy.running_order=arrival",
                 f"policy.max_num_seqs={VIDUR_CAP}"]
    overrides.append(f"policy.max_num_batched_tokens={TOKENS_IN_BATCH}" if scheduler == "vllm"
                     else f"policy.chunk_size={chunk}")
    cfg = api.compose(overrides)
    return cfg, api.model_setup(cfg)


def kvstudy_measure(cfg, model, prompt, output):
    from kvstudy import api
    from kvstudy.workloads.arrivals import poisson
    from kvstudy.workloads.requests import make_requests

    arch, hw, capacity, latency = model

    def measure(rate):
        arrival = poisson(len(prompt), rate, np.random.default_rng(0))
        req = make_requests(arrival, prompt, output, source="splitwise_conv")
        engine = api.build_engine(cfg, req, req.output_tokens, api.build_policy(cfg), VidurKeys(latency), arch, hw,
                                  capacity)
        q = engine.run().requests
        value = delay_p99(q.arrival_time, q.first_scheduled_time)
        return value <= SECONDS, value, "completed"

    return measure


def vidur_one(hardware, scheduler, chunk, n, rate):
    """One run of Vidur's simulator (in a process of its own: Vidur's entities count ids per process)."""
    from kvstudy.latency import vidur_adapter
    from kvstudy.latency.models import profile_files, vidur_cache_folder
    from kvstudy.workloads.arrivals import poisson

    prompt, output = lengths(n)
    _, (arch, hw, capacity, latency) = setup(hardware, scheduler, chunk)
    folder = str(vidur_cache_folder(latency.info["cache_key"]) / "vidur")
    arrival = poisson(len(prompt), rate, np.random.default_rng(0))
    with tempfile.TemporaryDirectory() as work:
        res = vidur_adapter.run_vidur_simulator(
            arch, hw, profile_files(arch, hw), latency.settings, folder, arrival, prompt, output, CAPACITY, work,
            max_tokens_in_batch=TOKENS_IN_BATCH, batch_size_cap=VIDUR_CAP, scheduler=scheduler, chunk_size=chunk,
            block_size=BLOCK, per_request=True)
    q = res["requests"]
    return delay_p99(q["arrival"], q["scheduled"])


def vidur_measure(hardware, scheduler, chunk, n):
    def measure(rate):
        proc = subprocess.run([sys.executable, __file__, "--vidur-one", hardware, scheduler, str(chunk), str(n),
                               repr(rate)], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-500:])
        value = float(proc.stdout.strip().splitlines()[-1])
        return value <= SECONDS, value, "completed"

    return measure


def main(argv):
    from kvstudy.search.capacity import search_rate

    if argv and argv[0] == "--vidur-one":
        print(vidur_one(argv[1], argv[2], int(argv[3]), int(argv[4]), float(argv[5])))
        return 0
    n = int(argv[0]) if argv else 1000
    hardware = argv[1:] or ["a100_tp2", "a100_tp4"]
    prompt, output = lengths(n)
    rows, total = [], [0, 0.0, 0, 0.0]
    print(f"{n} Splitwise conversation requests, Poisson arrivals (seed 0), criterion: scheduling delay p{QUANTILE * 100:g}"
          f" <= {SECONDS:g} s, tolerance {TOLERANCE:.0%}\n")
    print("| deployment | kvstudy req/s | Vidur req/s | difference | kvstudy sims / s | Vidur sims / s |")
    print("|---|---|---|---|---|---|")
    for hw in hardware:
        for scheduler, chunk in (("vllm", 512), ("sarathi", 256), ("sarathi", 512)):
            cfg, model = setup(hw, scheduler, chunk)
            name = f"{hw} {scheduler}" + (f" {chunk}" if scheduler == "sarathi" else "")
            t0 = time.perf_counter()
            ours = search_rate(kvstudy_measure(cfg, model, prompt, output), start=1.0, tolerance=TOLERANCE)
            ours_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            theirs = search_rate(vidur_measure(hw, scheduler, chunk, n), start=1.0, tolerance=TOLERANCE)
            theirs_s = time.perf_counter() - t0
            diff = 100 * (ours.capacity / theirs.capacity - 1) if ours.capacity and theirs.capacity else float("nan")
            rows.append((name, ours.capacity, theirs.capacity))
            total = [total[0] + len(ours.probes), total[1] + ours_s, total[2] + len(theirs.probes), total[3] + theirs_s]
            print(f"| {name} | {ours.capacity:.3g} ({ours.status}) | {theirs.capacity:.3g} ({theirs.status}) | "
                  f"{diff:+.1f}% | {len(ours.probes)} / {ours_s:.1f} | {len(theirs.probes)} / {theirs_s:.1f} |",
                  flush=True)
    tops = []
    for side, k in (("kvstudy", 1), ("Vidur", 2)):
        ranked = [r[0] for r in sorted(rows, key=lambda r: (-(r[k] or 0), r[0]))]
        tops.append(ranked[:3])
        print(f"{side} ranking: {', '.join(ranked)}")
    print(f"top 3 the same: {tops[0] == tops[1]}")
    print(f"whole search: kvstudy {total[0]} simulations in {total[1]:.1f} s, Vidur {total[2]} in {total[3]:.1f} s: "
          f"{total[3] / total[1]:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
