"""Issue 36's independent count through the engine on Mooncake's traces: with a cache too large to evict and requests
far apart, every request's ``prefix_cached_tokens`` should equal the longest run of its leading trace blocks seen in
earlier prompts, times 512, in whole 16-token blocks, at most prompt - 1 (``kvstudy.memory.prefix.reusable_tokens``).
The cache is the schema's largest (2^26 tokens): enough for the synthetic trace and the conversation trace's first
6,000 requests; the whole conversation trace needs more, so it evicts and a few hits fall short (counted).

    python bench/prefix_count.py synthetic_trace.jsonl 3983
    python bench/prefix_count.py conversation_trace.jsonl 6000 [--shared PATH]
"""
import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvstudy import api  # noqa: E402
from kvstudy.memory.prefix import reusable_tokens  # noqa: E402
from kvstudy.running.paths import SHARED_REFERENCE  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="conversation_trace.jsonl or synthetic_trace.jsonl")
    ap.add_argument("requests", type=int, help="the first N requests kept (after prompts over the context are dropped)")
    ap.add_argument("--shared", default=str(SHARED_REFERENCE))
    args = ap.parse_args(argv)
    path = Path(args.shared) / "traces-extra" / "mooncake" / args.trace
    warnings.simplefilter("ignore")
    started = time.perf_counter()
    result, summary = api.simulate(api.compose([
        "+policy=vllm", "workload=mooncake", f"workload.path={path}", f"workload.num_requests={args.requests}",
        "workload.rate_scale=0.001", "model=llama31_8b", "hardware=a100_tp1", "memory.prefix_caching=true",
        f"memory.capacity_tokens={1 << 26}", "latency=linear", "engine.progress=false"]))
    rows = [json.loads(line) for line in open(path)]
    req = result.requests
    kept = [rows[i] for i in req.request_id]  # the file's rows
    expected = reusable_tokens([r["hash_ids"] for r in kept], [r["input_length"] for r in kept])
    got = req.prefix_cached_tokens.tolist()
    wrong = sum(a != b for a, b in zip(got, expected))
    print(f"{args.trace}: {len(req)} requests, status {summary['status']}, {summary['prefix_evictions']} evictions, "
          f"{wrong} differ from the independent count, hit rate {100 * sum(got) / req.prompt_tokens.sum():.2f}% "
          f"({time.perf_counter() - started:.0f} s)")
    return 0 if wrong == 0 or summary["prefix_evictions"] else 1


if __name__ == "__main__":
    sys.exit(main())
