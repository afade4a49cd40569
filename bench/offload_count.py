"""Issue 49's independent count on Mooncake's whole traces: an unlimited host tier behind a GPU that holds one request,
requests one at a time through the engine; every request's cached tokens (GPU hit + loaded) against the longest run of
its leading trace blocks seen before (kvstudy.memory.prefix.reusable_tokens).

    python bench/offload_count.py        (about 70 s: 12,031 + 3,993 requests)
"""
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.memory.test_offload import HOST, HardwareSpec, SHARED_REFERENCE, load_model_arch, mooncake_segments, \
    reusable_tokens, run  # noqa: E402

# Llama-3.1-8B's shapes with a context long enough for the synthetic trace's 191k-token prompts (the latency model is
# the linear one: only the cache's bookkeeping is measured here)
ARCH = dataclasses.replace(load_model_arch("llama31_8b"), max_model_len=262144)
for name in ("conversation_trace.jsonl", "synthetic_trace.jsonl"):
    t = time.time()
    with open(SHARED_REFERENCE / "traces-extra" / "mooncake" / name) as f:
        trace = [json.loads(line) for line in f]
    prompt = [r["input_length"] for r in trace]
    output = [r["output_length"] for r in trace]
    segments = [mooncake_segments(r["hash_ids"], p) for r, p in zip(trace, prompt)]
    capacity = (max(p + o for p, o in zip(prompt, output)) // 16 + 2) * 16
    result, _ = run(list(zip(prompt, output)), segments, capacity_tokens=capacity, arch=ARCH,
                    hw=HardwareSpec("a100_tp1", "a100", "a100_pairwise_nvlink", 1), host_gb=1e9, choice="load", **HOST)
    got = result.requests.sort_values("request_id")["prefix_cached_tokens"].tolist()
    want = reusable_tokens([r["hash_ids"] for r in trace], prompt)
    loaded = result.requests["offload_loaded_tokens"].sum()
    print(f"{name}: {len(trace)} requests, equal to the independent count: {got == want}; cached "
          f"{100 * sum(got) / sum(prompt):.1f}% of prompt tokens (count {100 * sum(want) / sum(prompt):.1f}%), "
          f"{100 * loaded / sum(prompt):.1f}% loaded from the host tier; {time.time() - t:.1f} s")
