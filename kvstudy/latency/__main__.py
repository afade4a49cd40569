"""``python -m kvstudy.latency [model=.. hardware=.. latency=..]``: predicted times of three sample iterations.

(a) one 512-token prefill, (b) 64 decodes at 600 tokens of context, (c) both in one batch.
"""
import sys

from kvstudy.errors import KvStudyError


def main(argv=None) -> int:
    from kvstudy import api
    from kvstudy.arch import ModelArch
    from kvstudy.capacity import resolve_capacity

    try:
        cfg = api.compose(list(sys.argv[1:] if argv is None else argv))
        arch = ModelArch.from_mapping(api._plain(cfg.model))
        hw = api.hardware_spec(cfg)
        capacity = resolve_capacity(cfg.memory.capacity_tokens, arch, hw)
        lat = api.build_latency(cfg, arch, hw, capacity)
        rows = [("(a) one 512-token prefill", [(512, 0)], 0, 0),
                ("(b) 64 decodes at 600 tokens of context", [], 64, 64 * 600),
                ("(c) (a) and (b) in one batch", [(512, 0)], 64, 64 * 600)]
        print(f"{arch.name} on {hw.name}, latency={lat.name}: {lat.describe().get('source', '')}")
        for label, chunks, nd, ctx in rows:
            print(f"{label:42s} {lat.iteration_seconds(chunks, nd, ctx) * 1e3:9.2f} ms")
    except KvStudyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
