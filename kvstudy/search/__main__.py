"""``python -m kvstudy.search capacity [--criterion C] [--seeds 0,1] [--start R] [--tolerance F] [--min-rate R]
[--max-rate R] [--max-steps N] [--knob demand.rate] [--out FILE] -- OVERRIDES``

``python -m kvstudy.search grid SPEC.yaml [--out DIR] [--prices FILE] [--jobs N] [--launcher L] [--launcher-option
K=V ...]``: every deployment of a grid
(kvstudy/search/grid.py; SPEC: a YAML file, or the name of one in kvstudy/search/specs/), resumable; prints the best deployment, writes
``DIR/results.parquet`` and ``DIR/pareto.png``. ``--launcher``: local (default: ``--jobs`` processes), submitit_local,
slurm (``--launcher-option slurm_partition=cpu``) or ray (``--launcher-option address=...``): kvstudy/search/fanout.py.

One deployment's capacity under an SLO (issue 58; kvstudy/search/capacity.py): the highest request rate at which the
criterion holds (kvstudy/search/criteria.py; default ``goodput:ttft=2.5,tpot=0.15,share=0.9``, DistServe's), by
bisection, once per seed; the deployment is a run's Hydra overrides after ``--`` (as ``python -m kvstudy`` takes
them; ``+demand=...`` for Poisson arrivals at ``demand.rate``). Prints each probe and the capacity, writes the result
as JSON (``--out``, default ``outputs/search/capacity.json``; written whole or not at all).

    python -m kvstudy.search capacity --criterion scheduling_delay:quantile=0.99,seconds=2 --seeds 0,1 -- \\
        +policy=vllm +demand=high +deployment=p1d3 workload=splitwise_conv workload.num_requests=600 \\
        workload.over_context=drop
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvstudy.errors import ConfigError, cli_entry
from kvstudy.running.atomic import write_text_atomic
from kvstudy.running.paths import prepare_file
from kvstudy.search.capacity import check_search, deployment_capacity
from kvstudy.search.criteria import read_criterion


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvstudy.search", description=__doc__.split("\n\n")[1])
    p.add_argument("command", choices=["capacity", "grid"])
    p.add_argument("spec", nargs="?", help="grid: the search's YAML, or the name of one in kvstudy/search/specs/")
    p.add_argument("--prices", default=None, help="grid: a price table (gpu,usd_per_gpu_hour,source,date)")
    p.add_argument("--jobs", type=int, default=1, help="grid: deployments searched at once (local processes)")
    p.add_argument("--launcher", default="local", help="grid: local, submitit_local, slurm or ray (fanout.py)")
    p.add_argument("--launcher-option", action="append", default=[], metavar="KEY=VALUE",
                   help="grid: a launcher setting (slurm_partition=cpu, timeout_min=60, address=auto, ...)")
    p.add_argument("--criterion", default="goodput:ttft=2.5,tpot=0.15,share=0.9")
    p.add_argument("--seeds", default="0", help="comma-separated seeds, one search each")
    p.add_argument("--start", type=float, default=1.0, help="the first rate probed")
    p.add_argument("--tolerance", type=float, default=0.02, help="the bracket's width over its lower end at the end")
    p.add_argument("--min-rate", type=float, default=0.01)
    p.add_argument("--max-rate", type=float, default=1000.0)
    p.add_argument("--max-steps", type=int, default=40, help="simulations per seed at most")
    p.add_argument("--knob", default="demand.rate", choices=["demand.rate", "workload.rate_scale"])
    p.add_argument("--out", default=None, help="capacity: outputs/search/capacity.json; grid: outputs/search/<spec>")
    return p


def _seeds(text: str):
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds={text!r}: allowed: whole numbers separated by commas (0,1,2)") from None
    if not seeds:
        raise ConfigError(f"--seeds={text!r}: allowed: at least one seed")
    return seeds


@cli_entry
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, overrides = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = _parser().parse_args(own)
    if args.command == "grid":
        return _grid(args)
    if not overrides:
        raise ConfigError("no deployment: give a run's overrides after --, e.g. -- +policy=vllm +demand=high")
    criterion = read_criterion(args.criterion, "--criterion")
    seeds = _seeds(args.seeds)
    settings = dict(start=args.start, tolerance=args.tolerance, min_rate=args.min_rate, max_rate=args.max_rate,
                    max_steps=args.max_steps)
    check_search(**settings)
    out = prepare_file(Path(args.out or "outputs/search/capacity.json"), "--out")  # checked before any simulation
    result = deployment_capacity(overrides, criterion, seeds=seeds, knob=args.knob, **settings)
    for seed, search in zip(seeds, result["searches"]):
        for p in search["probes"]:
            print(f"seed {seed}  {args.knob}={p['rate']:.4g}  {'holds' if p['holds'] else 'fails'}  "
                  f"value {p['value']:.4g}  ({p['status']}, {p['seconds']:.1f} s)")
        print(f"seed {seed}: {search['status']}, capacity {search['capacity']}, lowest failing {search['failing']}")
    if result["found"]:
        print(f"capacity: mean {result['mean']:.4g} (min {result['min']:.4g}, max {result['max']:.4g}, "
              f"std {result['std']:.3g}) over {result['found']} of {result['seeds']} seed(s)")
    else:
        print(f"no capacity found: {', '.join(result['statuses'])}")
    write_text_atomic(out, json.dumps({**result, "settings": settings}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


def _grid(args) -> int:
    from kvstudy.running.paths import prepare_dir
    from kvstudy.search.grid import best, read_spec, run_grid
    from kvstudy.search.prices import read_prices

    if not args.spec:
        raise ConfigError("grid: no spec; allowed: python -m kvstudy.search grid SPEC.yaml (or a name in kvstudy/search/specs/)")
    if isinstance(args.jobs, bool) or args.jobs < 1:
        raise ConfigError(f"--jobs={args.jobs}: allowed: a whole number >= 1")
    spec = read_spec(args.spec)
    prices = read_prices(args.prices)
    out = Path(args.out) if args.out else Path("outputs/search") / Path(args.spec).stem
    prepare_dir(out, "--out")
    from kvstudy.search.fanout import LAUNCHERS, read_options

    if args.launcher not in LAUNCHERS:
        raise ConfigError(f"--launcher={args.launcher}: allowed: {', '.join(LAUNCHERS)}")
    table = run_grid(spec, out, prices, jobs=args.jobs, launcher=args.launcher,
                     options=read_options(args.launcher_option))
    top = best(table)
    found, above = int((table["status"] == "found").sum()), int((table["status"] == "above_range").sum())
    print(f"{len(table)} deployments under {spec.criterion_text}: {found} with a capacity, {above} meeting it at the "
          f"highest rate searched, {len(table) - found - above} skipped or unreachable")
    if spec.slo:
        limits = ", ".join(f"{k} <= {v:g} s" for k, v in spec.slo.items())
        print(f"{int(table['meets_slo'].sum())} of them meet the SLO at capacity ({limits})")
    if top is None:
        print("no deployment meets the SLO at any searched rate" + (" with its latencies at capacity" if spec.slo else ""))
    else:
        least = ">= " if top["status"] == "above_range" else ""
        print(f"best: {top['key']} ({top['gpus']} GPUs, ${top['usd_per_hour']:.2f}/h): capacity {least}"
              f"{top['capacity']:.3g} "
              f"req/s, {top['qps_per_usd_hour']:.3g} req/s per $/h, ${top['usd_per_million_requests']:.2f} per million "
              f"requests, TTFT p90 {top['ttft_p90']:.3g} s at capacity")
    print(f"wrote {out / 'results.parquet'} and {out / 'pareto.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
