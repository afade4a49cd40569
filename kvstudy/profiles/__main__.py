"""``python -m kvstudy.profiles {calibrate,build,errors}``: fit the GPU model, write profiles/, show errors."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvstudy.errors import cli_entry
from kvstudy.paths import CALIBRATION_FILE, CONF_DIR, PROFILES_DIR, SHARED_REFERENCE, load_model_arch


@cli_entry
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstudy.profiles", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cal = sub.add_parser("calibrate", help="fit efficiencies to real Vidur A100 measurements")
    cal.add_argument("--vidur-data", type=Path, default=SHARED_REFERENCE / "vidur-data")
    cal.add_argument("--out", type=Path, default=CALIBRATION_FILE)
    build = sub.add_parser("build", help="write Vidur-schema CSVs for every conf/model/*.yaml")
    build.add_argument("--out", type=Path, default=PROFILES_DIR)
    build.add_argument("--models", nargs="*", default=None,
                       help="model config names, or paths of model YAMLs outside the checkout (default: all of conf/model)")
    build.add_argument("--calibration", type=Path, default=CALIBRATION_FILE)
    build.add_argument("--device", default=None, help="GPU of kvstudy.profiles.gpu_model.DEVICES (default a100; "
                                                      "others are uncalibrated)")
    args = parser.parse_args(argv)
    if args.command == "calibrate":
        from kvstudy.profiles.calibration import write_calibration

        result = write_calibration(args.vidur_data, args.out)
        print(json.dumps(result["mlp_errors"], indent=1))
        print(f"wrote {args.out}")
        return 0
    from kvstudy.profiles.builder import build_model, build_network
    from kvstudy.profiles.calibration import load_calibration

    calib = load_calibration(args.calibration)
    names = args.models or sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
    for name in names:
        for path in build_model(load_model_arch(name), calib, args.out, device=args.device):
            print(f"wrote {path}")
    for path in build_network(calib, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
