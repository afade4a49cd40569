"""Where a grid's deployments run (issue 58, item 3): one job per deployment (its bisection is sequential: each probe's
rate depends on the last), through an existing engine, never a new one.

* ``local`` (the default): ``jobs`` processes on this machine (``concurrent.futures``), or this process with one;
* ``submitit_local``: submitit's local executor, each deployment a process of its own (the path to try before SLURM);
* ``slurm``: a SLURM array through submitit (``pip install -e ".[cluster]"``; needs ``sbatch``), options such as
  ``slurm_partition=cpu``, ``timeout_min=60``, ``cpus_per_task=1`` passed to ``update_parameters``;
* ``ray``: a Ray cluster (Vidur-Search's choice): ``ray.init(address=...)`` (option ``address``; without it Ray's own
  rule: ``RAY_ADDRESS``, else a local instance), each deployment one task of ``num_cpus`` (option, default 1).

Results come back in the grid's order, each as soon as it and those before it are done, so the caller writes each
record at once (a rerun resumes from them). Ctrl-C cancels the jobs not yet finished.
"""
from __future__ import annotations

import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

from kvstudy.errors import ConfigError

LAUNCHERS = ("local", "submitit_local", "slurm", "ray")


def read_options(items: List[str]) -> Dict[str, object]:
    """``key=value`` launcher options (numbers read as numbers); a malformed one is one line."""
    options: Dict[str, object] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--launcher-option {item!r}: allowed: key=value (e.g. slurm_partition=cpu)")
        for kind in (int, float):
            try:
                options[key] = kind(value)
                break
            except ValueError:
                continue
        else:
            options[key] = value
    return options


def fan_out(fn: Callable, args: list, launcher: str = "local", jobs: int = 1, folder: Optional[Path] = None,
            options: Optional[dict] = None) -> Iterator:
    """``fn(a)`` for each ``a`` of ``args``, in order, run where ``launcher`` says (module docstring)."""
    if launcher not in LAUNCHERS:
        raise ConfigError(f"--launcher={launcher}: allowed: {', '.join(LAUNCHERS)}")
    options = dict(options or {})
    if launcher == "local":
        if options:
            raise ConfigError(f"--launcher-option {next(iter(options))}: the local launcher takes none (--jobs N sets "
                              f"its processes)")
        return _local(fn, args, jobs)
    if launcher == "ray":
        return _ray(fn, args, options)
    return _submitit(fn, args, launcher, Path(folder or "submitit"), options)


def _local(fn, args, jobs):
    if jobs <= 1 or len(args) <= 1:
        yield from map(fn, args)
        return
    pool = ProcessPoolExecutor(max_workers=jobs)
    try:
        yield from pool.map(fn, args)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _submitit(fn, args, launcher, folder, options):
    try:
        import submitit
    except ImportError:
        raise ConfigError(f"--launcher={launcher} needs submitit: pip install -e \".[cluster]\"") from None
    if launcher == "slurm" and shutil.which("sbatch") is None:
        raise ConfigError("--launcher=slurm: no sbatch on the PATH (SLURM is not here); allowed: --launcher local, "
                          "submitit_local or ray")
    executor = submitit.AutoExecutor(folder=str(folder), cluster="slurm" if launcher == "slurm" else "local")
    try:
        executor.update_parameters(**options)
    except Exception as exc:  # submitit names the parameter it does not know
        raise ConfigError(f"--launcher-option: {exc}") from None
    return _submitted(executor, fn, args)


def _submitted(executor, fn, args):
    with executor.batch():  # one array job on SLURM
        jobs = [executor.submit(fn, a) for a in args]
    try:
        for job in jobs:
            yield job.result()
    finally:  # Ctrl-C (or an error): the rest are cancelled; a finished one's record is already written
        for job in jobs:
            if not job.done():
                job.cancel(check=False)


def _ray(fn, args, options):
    try:
        import ray
    except ImportError:
        raise ConfigError("--launcher=ray needs Ray: pip install ray (and a cluster: ray start --head, or "
                          "RAY_ADDRESS)") from None
    address = options.pop("address", None)
    num_cpus = options.pop("num_cpus", 1)
    if options:
        raise ConfigError(f"--launcher-option {next(iter(options))}: the ray launcher takes address and num_cpus")
    return _ray_tasks(ray, fn, args, address, num_cpus)


def _ray_tasks(ray, fn, args, address, num_cpus):
    if not ray.is_initialized():
        ray.init(address=address)
    remote = ray.remote(num_cpus=num_cpus)(fn)
    refs = [remote.remote(a) for a in args]
    done = 0
    try:
        for ref in refs:
            value = ray.get(ref)
            done += 1  # taken: not cancelled if the caller stops here
            yield value
    finally:
        for ref in refs[done:]:
            ray.cancel(ref)
