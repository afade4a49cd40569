"""The first iteration after which a run holds more KV blocks than its cache (paged memory), with that iteration's
decision: what issue 59 used to find where CacheOPT's run of 10^6 requests overfills the cache (docs/benchmarks.md,
"Every policy, 10^3 to 10^6 requests, after"). The engine's own check refuses the *next* decision; this names the one
that overfilled.

    python bench/capacity_invariant.py OVERRIDE [OVERRIDE ...]
    python bench/capacity_invariant.py +policy=cacheopt +demand=high workload.num_requests=1000000 \\
        policy.slo.ttft_ref=45835.850890968075 policy.slo.tbt_ref=0.07809665006569061

(The two references are what CacheOPT's calibration computes for that run: fixing them skips its four reference runs
and gives the same SLOs.)
"""
import sys
import time

from kvstudy import api
from kvstudy.engine import records


class Overfilled(Exception):
    pass


def watch(name: str) -> None:
    plain = getattr(records.PagedRows, name)

    def checked(self, *args, **kwargs):
        plain(self, *args, **kwargs)
        mem = self.memory
        if mem.used > mem.num_blocks:
            decision = args[3] if name == "iteration" else None
            raise Overfilled(f"row {len(self.rows) - 1} ({name}, start {args[0]:.6g} s): {mem.used}/{mem.num_blocks} "
                             f"blocks in use after it; its decision: {decision}")
    setattr(records.PagedRows, name, checked)


def main(argv) -> int:
    for name in ("iteration", "decode_only", "clearing"):
        watch(name)
    t0 = time.perf_counter()
    try:
        _, summary = api.simulate(api.compose([*argv, "engine.progress=false"]))
    except Overfilled as over:
        print(f"over capacity: {over} ({time.perf_counter() - t0:.0f} s)")
        return 1
    print(f"never over capacity; status {summary['status']} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
