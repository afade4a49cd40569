"""``python -m kvstudy.preemption_cost model=opt_13b hardware=a100_tp1 [swap=vllm_blocks] [out=DIR]``: CacheOPT's
swap-vs-recompute regressors (Shen et al. Sec. 3.5) for one model and hardware, fitted and plotted. The measurement
and the fit are kvstudy/costs/preemption_cost.py; this module is only the command."""
from __future__ import annotations

import sys
from pathlib import Path

from kvstudy import api
from kvstudy.costs.preemption_cost import PreemptionCost, fit, measure
from kvstudy.errors import cli_entry
from kvstudy.running.paths import prepare_dir, prepare_file


def plot(sizes, rec, swp, cost: PreemptionCost, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(sizes, rec * 1e3, "o", ms=3, label="recompute (Vidur prefill)")
    ax.plot(sizes, swp * 1e3, "s", ms=3, label="swap out+in")
    ax.plot(sizes, cost.recompute(sizes) * 1e3, "-", lw=1, label=f"L_r fit (beta={cost.beta_r:.2f})")
    ax.plot(sizes, cost.swap(sizes) * 1e3, "-", lw=1, label="L_s fit")
    if cost.sweet_spot:
        ax.axvline(cost.sweet_spot, color="gray", ls="--", lw=1, label=f"sweet spot {cost.sweet_spot:.0f}")
    ax.set_xlabel("sequence length S (tokens)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _describe_spot(cost: PreemptionCost, horizon: int) -> str:
    if cost.sweet_spot:
        below = cost.choose(max(1, int(cost.sweet_spot) - 1))
        return f"{cost.sweet_spot:.0f} tokens ({below} below, {cost.choose(int(cost.sweet_spot) + 1)} above)"
    return f"none: {cost.choose(16)} is cheaper at every length from 16 to {horizon} tokens"


@cli_entry
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    out, given = Path("outputs/preemption_cost"), False
    for arg in list(argv):
        if arg.startswith("out="):
            out, given = Path(arg.split("=", 1)[1]), True
            argv.remove(arg)
    cfg = api.compose(argv)
    name = f"{cfg.model.name}_{cfg.hardware.name}_{cfg.swap.name}"  # model_setup names arch and hw by these
    # the output checked and its folder made before the predictor is built (kvstudy/running/paths.py): one line
    prepare_dir(out, "out" if given else None, fix="choose another folder (out=DIR)")
    prepare_file(out / f"{name}.png", fix="choose another folder (out=DIR)")
    arch, hw, capacity, latency = api.model_setup(cfg)
    max_tokens = min(8192, capacity)
    swap = api._instantiate(cfg.swap)
    sizes, rec, swp = measure(latency, arch, hw, max_tokens, arch.max_model_len, swap=swap,
                              block_size=int(cfg.memory.get("block_size", 16)))
    cost = fit(sizes, rec, swp)
    plot(sizes, rec, swp, cost, f"{arch.name} on {hw.name}", out / f"{name}.png")
    print(f"{name}: L_r(S) = {cost.alpha_r:.3g} S^{cost.beta_r:.2f} + {cost.kappa_r:.3g} S + {cost.eps_r:.3g}; "
          f"L_s(S) = {cost.gamma_s:.3g} S + {cost.delta_s:.3g}; fit MAPE {cost.fit_mape_pct}; "
          f"sweet spot {_describe_spot(cost, 4 * max_tokens)}; "
          f"plot {out / (name + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
