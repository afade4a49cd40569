"""Result hashes of a set of runs from one source tree: the check that a change leaves results as they were, on
configs the comparison set (bench/compare_set.sh) does not reach or for a quicker answer.

    python bench/config_hashes.py SRC [SET]     (SET: offload, the default, or a JSON file of override lists)

SRC is a checkout (a worktree of the commit before, say); it goes first on sys.path, so the runs use its code. One line
per config: its overrides, status, completed requests, a hash of the requests and iterations tables (CSV) and a hash of
the summary without wall times, paths and provenance. Run it from both trees and diff the outputs.
"""
import hashlib
import json
import sys

DROP = ("second", "wall", "sha", "fingerprint", "commit", "dirty", "policy_us")

_MOONCAKE = ["memory=paged_offload", "workload=mooncake", "workload.num_requests=3000", "workload.rate_scale=0.125",
             "memory.capacity_tokens=auto", "model=llama31_8b", "hardware=a100_tp1", "engine.progress=false"]
_CLUSTER = ["memory=paged_offload", "workload=mooncake", "workload.num_requests=2000", "workload.rate_scale=0.5",
            "memory.capacity_tokens=auto", "model=llama31_8b", "hardware=a100_tp1", "engine.progress=false",
            "cluster.replicas=4", "+policy=vllm"]
#: the offload tiers (issue 59's fourth session): three policies at three host sizes, host+disk, overlapped loads,
#: choice=load, Sarathi on a tiny tier, four replicas with shared and own pools
OFFLOAD = ([[f"+policy={p}", *_MOONCAKE, f"memory.offload.host_gb={g}"] for p in ("vllm", "lpm", "mcsf_prefix")
            for g in ("64", "256", "1e9")]
           + [["+policy=vllm", *_MOONCAKE, "memory.offload.host_gb=16", "memory.offload.disk_gb=64"],
              ["+policy=vllm", *_MOONCAKE, "memory.offload.host_gb=8", "memory.offload.disk_gb=8",
               "memory.offload.load=overlapped"],
              ["+policy=vllm", *_MOONCAKE, "memory.offload.host_gb=32", "memory.offload.choice=load"],
              ["+policy=sarathi", *_MOONCAKE, "memory.offload.host_gb=2"]]
           + [[*_CLUSTER, f"router={r}", f"memory.offload.host_gb={g}", "memory.offload.shared=true"]
              for r in ("round_robin", "prefix_affinity") for g in ("64", "1e9")]
           + [[*_CLUSTER, "router=round_robin", "memory.offload.host_gb=8", "memory.offload.shared=false"]])


def _clean(x):
    if isinstance(x, dict):
        # the latency model's "source" (trained, cut or cache) says whether this process built Vidur's predictor:
        # provenance, like the wall times (a tree's first run trains it)
        return {k: _clean(v) for k, v in x.items()
                if not any(d in k for d in DROP) and not (isinstance(v, str) and "/" in v) and "/" not in k
                and not (k == "source" and "cache_key" in x)}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def main() -> None:
    src = sys.argv[1]
    which = sys.argv[2] if len(sys.argv) > 2 else "offload"
    configs = OFFLOAD if which == "offload" else json.load(open(which))
    sys.path.insert(0, src)
    import kvstudy
    from kvstudy import api

    if not kvstudy.__file__.startswith(str(__import__("pathlib").Path(src).resolve())):
        sys.exit(f"kvstudy imported from {kvstudy.__file__}, not from {src}")
    for overrides in configs:
        result, summary = api.simulate(api.compose(overrides))
        tables = hashlib.sha1()
        for frame in (result.requests, result.iterations):
            tables.update(frame.to_csv().encode())
        rest = hashlib.sha1(json.dumps(_clean(summary), sort_keys=True, default=str).encode()).hexdigest()[:12]
        print(" ".join(overrides), summary["status"], summary.get("completed"), tables.hexdigest()[:12], rest,
              flush=True)


if __name__ == "__main__":
    main()
