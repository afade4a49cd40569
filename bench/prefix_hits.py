"""Mooncake's traces through vLLM-style prefix caching alone (kvstudy/memory/prefix.py), before any scheduler: the
share of prompt tokens an LRU block cache of a given size would serve if requests ran one at a time in arrival
order, each holding its blocks only while it runs (issue 36's groundwork; the engine's runs with scheduling and
concurrency come later). 16-token blocks; a prompt reuses at most prompt - 1 tokens.

    python bench/prefix_hits.py [--shared PATH] [--blocks 65536 262144 ...]
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvstudy.memory.prefix import lru_hit_rate  # noqa: E402
from kvstudy.running.paths import SHARED_REFERENCE  # noqa: E402


def hit_rate(trace, num_blocks: int, block: int = 16) -> float:
    return lru_hit_rate([r["hash_ids"] for r in trace], [r["input_length"] for r in trace],
                        [r["output_length"] for r in trace], num_blocks, block)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=str(SHARED_REFERENCE))
    ap.add_argument("--blocks", type=int, nargs="+", default=[8192, 32768, 131072, 524288, 1 << 30])
    args = ap.parse_args(argv)
    folder = Path(args.shared) / "traces-extra" / "mooncake"
    print("| trace | cache blocks (16 tokens) | cache tokens | hit rate | seconds |\n|---|---|---|---|---|")
    for name in ("conversation_trace.jsonl", "synthetic_trace.jsonl"):
        trace = [json.loads(line) for line in open(folder / name)]
        for blocks in args.blocks:
            t0 = time.perf_counter()
            rate = hit_rate(trace, blocks)
            print(f"| {name.split('_')[0]} | {blocks:,} | {blocks * 16:,} | {100 * rate:.1f}% | "
                  f"{time.perf_counter() - t0:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
