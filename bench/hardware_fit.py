"""The profile builder's fit per operator and calibration model on a measured GPU (issue 48's closing numbers).

    python bench/hardware_fit.py [--device h100] [--vidur-data ../shared/reference/vidur-data]

Prints, for every MLP-block operator, the median and p90 absolute percentage error of the committed calibration
(profiles/calibration[_<device>].json) against every measured row of each calibration model (all TP sizes), then the
same pooled, and each fitted collective's error. Reads the measurements, writes nothing.
"""
import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from kvstudy.profiles.calibration import _predict, calibration_file, load_calibration, load_measured_mlp
from kvstudy.profiles.gpu_model import MLP_OPS
from kvstudy.running.paths import SHARED_REFERENCE


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="h100")
    p.add_argument("--vidur-data", type=Path, default=SHARED_REFERENCE / "vidur-data")
    args = p.parse_args()
    calib = load_calibration(calibration_file(args.device))
    measured = load_measured_mlp(args.vidur_data, args.device)
    rows = []
    for op in MLP_OPS:
        df = measured[measured["op"] == op].reset_index(drop=True)
        df["ape"] = np.abs(_predict(df, op, calib["mlp_ops"][op], args.device) / df["ms"].to_numpy() - 1) * 100
        for model, part in list(df.groupby("model")) + [("all", df)]:
            rows.append({"op": op, "model": model.split("/")[-1], "rows": len(part),
                         "median %": np.median(part["ape"]), "p90 %": np.percentile(part["ape"], 90)})
    table = pd.DataFrame(rows).pivot_table(index="op", columns="model", values=["median %", "p90 %"], sort=False)
    pd.set_option("display.width", 200)
    print(f"{args.device}: fit of {calibration_file(args.device).name} against Vidur's measured mlp.csv rows")
    print(table.round(1).to_string())
    net = pd.DataFrame(calib["network"])
    print(net[["node", "collective", "workers", "devices_per_node", "alpha_ms", "bus_gbps", "median_ape_pct",
               "p90_ape_pct", "rows"]].to_string(index=False))


if __name__ == "__main__":
    main()
