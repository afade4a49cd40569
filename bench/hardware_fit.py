"""The profile builder's fit per operator and calibration model on a measured GPU (issue 48's closing numbers).

    python bench/hardware_fit.py [--device h100] [--vidur-data ../shared/reference/vidur-data] [--floor]
                                 [--refit {roofline,overlap}]

Prints, for every MLP-block operator, the median and p90 absolute percentage error of the committed calibration
(profiles/calibration[_<device>].json) against every measured row of each calibration model (all TP sizes), then the
same pooled, and each fitted collective's error; the whole MLP block (the sum of the nine operators, what a simulated
iteration adds per layer) per (model, TP): its median error and its median measured/predicted ratio per token range;
then, per GEMM, how rough the measurements themselves are (issue 54:
why H100's fit is weaker than A100's): the share of rows that take over 10% longer than the same matrix at some larger
token count (no model whose time grows with the token count can follow them), and the spread across (model, TP) of the
compute efficiency at 2,048-4,096 tokens (one eta per operator has to cover it). ``--floor`` adds each GEMM's pooled
median when every (model, TP) gets constants of its own (9 fits instead of 1), plain roofline and ECM overlap form: how
low a model of that form can go on these rows at all (about a minute). ``--refit`` replaces the committed MLP fit by a
fresh one of the given form (``roofline``: issue 54's H100 fit before the overlap term; ``overlap``: the term on A100,
which keeps the roofline). Reads the measurements, writes nothing.
"""
import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from kvstudy.profiles.calibration import (_arch_from_row, _predict, calibration_file, fit_mlp_ops, load_calibration,
                                         load_measured_mlp)
from kvstudy.profiles.gpu_model import DEVICES, GEMM_OPS, MLP_OPS, op_work
from kvstudy.running.paths import SHARED_REFERENCE


def roughness(measured: pd.DataFrame, device: str) -> pd.DataFrame:
    """Per GEMM: % of rows >10% slower than a larger token count of the same (model, TP), the lowest and highest
    (model, TP) median efficiency (achieved FLOP/s over the datasheet peak) at 2,048-4,096 tokens, and the line through
    the 1-8-token rows' median time against the bytes moved (weights streamed): a launch cost and a bandwidth."""
    rows = []
    for op in GEMM_OPS:
        slower, eff, small = [], [], []
        for (model, tp), g in measured[measured["op"] == op].groupby(["model", "tp"]):
            g = g.sort_values("num_tokens")
            few = g[g["num_tokens"] <= 8]
            _, nbytes = op_work(_arch_from_row(g.iloc[0], model), int(tp), few["num_tokens"].to_numpy())[op]
            small.append((nbytes.mean(), few["ms"].median()))
            t = g["ms"].to_numpy()
            slower.append(np.mean(t > 1.1 * np.minimum.accumulate(t[::-1])[::-1]))
            big = g[g["num_tokens"] >= 2048]
            flops, _ = op_work(_arch_from_row(g.iloc[0], model), int(tp), big["num_tokens"].to_numpy())[op]
            eff.append(np.median(flops / (big["ms"].to_numpy() * 1e-3) / (DEVICES[device].peak_tflops * 1e12)))
        slope, launch = np.polyfit(*np.array(small).T, 1)  # ms = launch + bytes * slope over the 1-8-token rows
        rows.append({"op": op, "rows slower than a larger count %": 100 * np.mean(slower),
                     "eta at 2k-4k tokens, lowest": min(eff), "highest": max(eff),
                     "1-8 tokens: launch us": launch * 1e3, "GB/s": 1e-6 / slope})
    return pd.DataFrame(rows).set_index("op")


def floor(measured: pd.DataFrame, device: str) -> pd.DataFrame:
    """Per GEMM: pooled median APE % with constants fitted to each (model, TP) alone, without and with phi."""
    out = {}
    for form, overlap in (("roofline, per (model, TP)", False), ("ECM overlap, per (model, TP)", True)):
        ape = {op: [] for op in GEMM_OPS}
        for _, part in measured[measured["op"].isin(GEMM_OPS)].groupby(["model", "tp"]):
            params = fit_mlp_ops(part, device, overlap=overlap, ops=GEMM_OPS)
            for op in GEMM_OPS:
                df = part[part["op"] == op].reset_index(drop=True)
                ape[op] += list(np.abs(_predict(df, op, params[op], device) / df["ms"].to_numpy() - 1) * 100)
        out[form] = {op: np.median(v) for op, v in ape.items()}
    return pd.DataFrame(out)


def block(measured: pd.DataFrame, mlp_ops: dict, device: str) -> pd.DataFrame:
    """The MLP block's time per layer (sum of MLP_OPS) per (model, TP, num_tokens): median APE % and the median of
    measured / predicted per token range."""
    parts = []
    for op in MLP_OPS:
        df = measured[measured["op"] == op].reset_index(drop=True)
        parts.append(df.assign(pred=_predict(df, op, mlp_ops[op], device)))
    d = pd.concat(parts).groupby(["model", "tp", "num_tokens"])[["ms", "pred"]].sum().reset_index()
    d["model"] = d["model"].str.split("/").str[-1]
    d["ratio"] = d["ms"] / d["pred"]
    d["tokens"] = pd.cut(d["num_tokens"], [0, 64, 128, 256, 512, 1024, 4096],
                         labels=["1-64", "65-128", "129-256", "257-512", "513-1024", "1025-4096"])
    table = d.pivot_table(index=["model", "tp"], columns="tokens", values="ratio", aggfunc="median", observed=True)
    table.insert(0, "block median APE %", d.assign(ape=(d["ratio"] - 1).abs() * 100).groupby(["model", "tp"])["ape"]
                 .median())
    table.loc[("all", ""), "block median APE %"] = float(np.median((d["ratio"] - 1).abs() * 100))
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="h100")
    p.add_argument("--vidur-data", type=Path, default=SHARED_REFERENCE / "vidur-data")
    p.add_argument("--floor", action="store_true", help="also fit each (model, TP) alone (about a minute)")
    p.add_argument("--refit", choices=("roofline", "overlap"), default=None,
                   help="fit the MLP block afresh in this form instead of reading the committed calibration's")
    args = p.parse_args()
    calib = load_calibration(calibration_file(args.device))
    measured = load_measured_mlp(args.vidur_data, args.device)
    if args.refit:
        calib = {**calib, "mlp_ops": fit_mlp_ops(measured, args.device, overlap=args.refit == "overlap")}
    rows = []
    for op in MLP_OPS:
        df = measured[measured["op"] == op].reset_index(drop=True)
        df["ape"] = np.abs(_predict(df, op, calib["mlp_ops"][op], args.device) / df["ms"].to_numpy() - 1) * 100
        for model, part in list(df.groupby("model")) + [("all", df)]:
            rows.append({"op": op, "model": model.split("/")[-1], "rows": len(part),
                         "median %": np.median(part["ape"]), "p90 %": np.percentile(part["ape"], 90)})
    table = pd.DataFrame(rows).pivot_table(index="op", columns="model", values=["median %", "p90 %"], sort=False)
    pd.set_option("display.width", 200)
    fit = f"a fresh {args.refit} fit" if args.refit else calibration_file(args.device).name
    print(f"{args.device}: {fit} against Vidur's measured mlp.csv rows")
    print(table.round(1).to_string())
    net = pd.DataFrame(calib["network"])
    print(net[["node", "collective", "workers", "devices_per_node", "alpha_ms", "bus_gbps", "median_ape_pct",
               "p90_ape_pct", "rows"]].to_string(index=False))
    print(f"{args.device}: the MLP block per layer: median APE %, then median measured / predicted per token range")
    print(block(measured, calib["mlp_ops"], args.device).round(2).to_string(na_rep=""))
    print(f"{args.device}: how rough the measured GEMM rows are (over every calibration model and TP)")
    print(roughness(measured, args.device).round(2).to_string())
    if args.floor:
        print(f"{args.device}: pooled GEMM median APE % with constants of its own for every (model, TP)")
        print(floor(measured, args.device).round(2).to_string())


if __name__ == "__main__":
    main()
