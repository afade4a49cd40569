"""``python -m kvstudy.latency [model=.. hardware=.. latency=..]``: predicted times of three sample iterations.

(a) one 512-token prefill, (b) 64 decodes at 600 tokens of context (100 of them produced, for a model that asks),
(c) both in one batch.
"""
import sys

from kvstudy.errors import cli_entry


@cli_entry
def main(argv=None) -> int:
    from kvstudy import api
    from kvstudy.config.validate import check_config, check_overrides

    argv = list(sys.argv[1:] if argv is None else argv)
    check_overrides(argv)  # a key no config has, a group chosen twice: one line before Hydra
    cfg = api.compose(argv)
    check_config(cfg)  # every value against kvstudy/config/schema.py before the predictor is built
    arch, hw, _, lat = api.model_setup(cfg)
    rows = [("(a) one 512-token prefill", [(512, 0)], 0, 0),
            ("(b) 64 decodes at 600 tokens of context", [], 64, 64 * 600),
            ("(c) (a) and (b) in one batch", [(512, 0)], 64, 64 * 600)]
    print(f"{arch.name} on {hw.name}, latency={lat.name}: {lat.describe().get('source', '')}")
    for label, chunks, nd, ctx in rows:
        # a model that reads the decodes' produced tokens (mcsf_authors): 100 of each decode's context
        extra = {"decode_generated_sum": nd * 100} if getattr(lat, "needs_generated", False) else {}
        print(f"{label:42s} {lat.iteration_seconds(chunks, nd, ctx, **extra) * 1e3:9.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
