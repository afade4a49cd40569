"""``python -m kvstudy +policy=NAME [+demand=NAME] [overrides]``: one simulation, or a sweep with -m."""
from __future__ import annotations

import logging
import sys
import warnings

try:  # Ctrl-C while the command starts (its imports take ~1 s): one line, as later (the new-user trial, issue 54)
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig

    from kvstudy.running.paths import CONF_DIR, shown_path
except KeyboardInterrupt:
    print("error: interrupted (Ctrl-C) while starting the command; nothing was written", file=sys.stderr)
    sys.exit(130)


def _time_unit(summary: dict) -> str:
    """Seconds, except under the MC-SF paper's unit-time model, whose clock counts rounds."""
    return "rounds" if (summary.get("latency") or {}).get("name") == "unit" else "s"


def _peak_kv(summary: dict) -> str:
    """Peak KV in use against capacity; with prefix caching the distinct blocks (a shared block once), beside the sum
    of the requests' contexts (``kv_tokens_in_use`` counts a shared prefix once per request)."""
    memory = summary.get("memory") or {}
    if "prefix_hit_rate" in summary and "block_size" in memory:
        bs = memory["block_size"]
        return (f"{summary['peak_blocks_used'] * bs} / {memory['num_blocks'] * bs} in distinct blocks "
                f"({summary['peak_kv_tokens']} summed over requests, shared prefixes once per request)")
    return f"{summary['peak_kv_tokens']} / {summary['capacity_tokens']}"


def _offload_rows(offload) -> list:
    """memory=paged_offload: each tier's hit rate, blocks and bytes read and written, blocks held at the end; the
    tokens loaded and the loads' time (the summary's ``offload``, kvstudy/memory/offload.py ``summary``)."""
    if not offload:
        return []
    if "tiers" not in offload:  # a user's connector (memory.connector): its summary as it gives it
        return [("connector", ", ".join(f"{k} {v}" for k, v in offload.items()))]
    rows, looked = [], "tokens looked up" if "lookup_tokens" in offload else "prompt tokens"  # its hit rate's base
    for name, t in offload["tiers"].items():
        rows.append((f"{name} tier", f"hit rate {100 * t['hit_rate']:.1f}% of {looked}; read {t['read_blocks']:,} "
                                     f"blocks ({t['read_bytes'] / 1e9:,.1f} GB), written {t['written_blocks']:,} "
                                     f"({t['written_bytes'] / 1e9:,.1f} GB), {t['blocks']:,} held at the end"))
    remote = f", {offload['remote_blocks']:,} blocks from other nodes" if offload.get("shared") else ""
    rows.append(("offload loads", f"{offload.get('loaded_tokens', 0):,} tokens in {offload['load_seconds']:.4g} s "
                                  f"({offload['load']}; choice {offload['choice']}: {offload['recomputed_blocks']:,} "
                                  f"blocks found but recomputed){remote}"))
    return rows


def _print_summary(summary: dict, folder: str) -> None:
    unit = _time_unit(summary)
    rows = [("status", summary["status"]), ("policy", summary.get("policy")),
            ("hardware", summary.get("hardware") + (f"  ({summary['hardware_note']})" if summary.get("hardware_note")
                                                    else ""))]
    offered = summary.get("offered_load")
    if offered:  # +demand=relative: the rate this hardware's capacity gave (kvstudy/running/offered_load.py)
        rows.append(("offered load", f"{offered['load']:g} x capacity {offered['capacity_rps']:.4g} requests/s = "
                                     f"Poisson {offered['rate']:.4g} requests/s"))
    rows += [("requests completed", f"{summary['completed']}/{summary['num_requests']}")]
    cluster = summary.get("cluster")
    if cluster:  # cluster.replicas > 1: the split, and peak KV below is the largest of any one replica's
        split = "/".join(str(r["requests"]) for r in cluster["per_replica"])
        rows.append(("replicas", f"{cluster['replicas']} behind router {cluster['router']}; requests each {split}"))
    for key in ("e2e_latency", "ttft", "tbt"):
        st = summary[key]
        if st["mean"] is not None:
            rows.append((f"{key} ({unit})", f"mean {st['mean']:.4g}  median {st['median']:.4g}  p90 {st['p90']:.4g}  "
                                            f"p99 {st['p99']:.4g}"))
    rows += [(f"throughput (tokens/{'round' if unit == 'rounds' else 's'})", f"{summary['throughput_tokens_per_time'] or 0:.4g}"),
             ("peak KV tokens" + (" (one replica)" if cluster else ""), _peak_kv(summary)),
             ("KV capacity", summary.get("kv_capacity")),
             ("iterations", summary["iterations"])]
    if "preemptions_swap" in summary:  # memory=paged: preemptions by mode (and an admission policy's clearings)
        rows.append(("preemptions", f"{summary['preemptions_recompute']} recompute, {summary['preemptions_swap']} swap"
                                    f" ({summary['swap_fallbacks']} swap fell back to recompute)"))
        if summary.get("clearing_events"):
            rows.append(("clearing events", summary["clearing_events"]))
    else:
        rows.append(("clearing events", summary["clearing_events"]))
    if "prefix_hit_rate" in summary:  # memory.prefix_caching=true
        tiers = ((" (GPU and offload tiers together)" if "tiers" in summary["offload"] else " (GPU and connector "
                  "together)") if summary.get("offload") else "")
        rows.append(("prefix cache", f"hit rate {100 * summary['prefix_hit_rate']:.1f}% of prompt tokens{tiers}, "
                                     f"{summary['prefix_evictions']} blocks evicted"))
    rows += _offload_rows(summary.get("offload"))
    rows.append(("wall time (s)", summary.get("wall_seconds")))
    if summary.get("message"):
        rows.append(("note", summary["message"]))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"outputs: {shown_path(folder)}")  # relative to the current folder when inside it (the README's line)


def _log_to_file(message: str) -> None:
    """``message`` into the run's log file (Hydra's ``<run>/__main__.log``) only: the terminal gets it once, on stderr,
    from ``report`` (the console handler would print it a second time)."""
    record = logging.LogRecord("kvstudy", logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _internal_error(exc: Exception, folder: str) -> int:
    """An exception that is no user error (a bug in a policy's code, or in kvstudy): its traceback on stderr and in
    the run's error.txt, then one line; status 1."""
    import traceback

    from kvstudy.running.sweep_callback import internal_error_text, record_error

    print("".join(traceback.format_exception(exc)), file=sys.stderr, end="")
    record_error(folder, internal_error_text(exc))
    print(f"error: {type(exc).__name__}: {exc} raised inside the run, not a config error (a bug in the policy's "
          f"code or in kvstudy): traceback above and in {folder}/error.txt", file=sys.stderr)
    return 1


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.types import RunMode

    from kvstudy.errors import KvStudyError, interrupted, report, resource_error
    from kvstudy.running.sweep_callback import run_recording_errors

    # a warning is one line on the command line, as errors are (in every sweep worker too: this runs there)
    warnings.formatwarning = lambda message, category, *args, **kwargs: f"warning: {message}\n"
    folder = HydraConfig.get().runtime.output_dir
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:  # a user error is recorded in the run's folder (error.txt and Hydra's log) as well as printed
        summary = run_recording_errors(cfg, folder)
    except KvStudyError as exc:
        _log_to_file(f"error: {exc}")
        if multirun:  # one bad value of a sweep fails its own run only; FailedRuns counts it at the end
            report(exc)
            return
        sys.exit(report(exc))
    except KeyboardInterrupt as exc:  # outside the engine (building profiles, training): one line, as a run's, 130
        if multirun:
            raise
        sys.exit(interrupted(exc))
    except Exception as exc:  # not a user error: a bug in a policy (a user's own) or in kvstudy
        err = resource_error(exc, folder)  # or a full disk, a name too long: one line naming the path
        if err is not None:
            _log_to_file(f"error: {err}")
            report(err)
            if multirun:
                return
            sys.exit(2)
        if multirun:
            raise
        sys.exit(_internal_error(exc, folder))
    if summary.get("skipped"):
        print(f"complete already, skipped: {shown_path(folder)} (resume=never runs it again)")
        if summary["status"] not in ("completed",):
            print(f"error: the finished run ended with status {summary['status']}: {summary.get('message')}",
                  file=sys.stderr)
            sys.exit(3)
        return
    _print_summary(summary, folder)
    if summary["status"] == "interrupted":
        sys.exit(130)
    if summary["status"] != "completed" and not multirun:  # no_progress, stalled, nothing_served, max_iterations
        why = summary.get("message") or "see the note above"
        if summary["completed"] == 0 and summary["status"] != "nothing_served":
            why = f"no request was served: {why}"
        print(f"error: run ended with status {summary['status']}: {why}", file=sys.stderr)
        sys.exit(3)


def _cli() -> None:
    from kvstudy.errors import KvStudyError, interrupted, report

    try:
        from kvstudy.config.cli_overrides import command_line
        from kvstudy.config.validate import check_overrides
        from kvstudy.running.precheck import cfg_notes

        try:
            check_overrides(sys.argv[1:])
            notes = cfg_notes(sys.argv[1:])  # --cfg: what the printed config's run would refuse or ignore, said too
            sys.argv[1:] = command_line(sys.argv[1:])
        except KvStudyError as exc:
            sys.exit(report(exc))
        for note in notes:
            print(f"warning: {note}", file=sys.stderr)
        main()
    except KeyboardInterrupt as exc:  # before the run's own handling takes over (Hydra composing, checks)
        sys.exit(interrupted(exc))


if __name__ == "__main__":
    _cli()
