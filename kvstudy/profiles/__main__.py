"""``python -m kvstudy.profiles {calibrate,build,errors}``: fit the GPU model, write profiles/, show errors."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from kvstudy.errors import ConfigError, DataError, cli_entry
from kvstudy.profiles.calibration import calibration_file
from kvstudy.profiles.devices import CALIBRATED, DEVICES, device
from kvstudy.running.paths import (CONF_DIR, REPO_ROOT, PROFILES_DIR, SHARED_REFERENCE, load_model_arch,
                                 prepare_dir, prepare_file)


def _check_paths(args) -> None:
    """Input paths that cannot be read (a folder for a file, a missing folder), and the output prepared by
    kvstudy/running/paths.py (a file, a path under a file, a folder that cannot be written): one line each, before
    any work."""
    if args.command == "calibrate":
        if args.device not in CALIBRATED:
            raise ConfigError(f"--device {args.device}: no measurements to calibrate on; allowed {', '.join(CALIBRATED)} "
                              f"(the others borrow a calibrated GPU's fit: kvstudy/profiles/devices.py)")
        if not args.vidur_data.is_dir():
            raise ConfigError(f"--vidur-data {args.vidur_data}: not a folder; allowed: a checkout of Vidur's data/ "
                              f"(profiling/compute/{args.device}/...)")
        if args.out is None:
            args.out = calibration_file(args.device)
        prepare_file(args.out, "--out", fix="allowed: a .json file path")  # its folder made: written without mkdir
    if args.command == "build":
        if args.device is not None:
            device(args.device)  # a GPU the builder knows, before anything is read
        if args.calibration is None:  # the calibration the device rests on (no device: A100's, as before issue 48)
            args.calibration = calibration_file(device(args.device or "a100").calibration)
        if args.calibration.exists() and not args.calibration.is_file():
            raise ConfigError(f"--calibration {args.calibration}: not a regular file; allowed: the JSON "
                              f"`python -m kvstudy.profiles calibrate` writes")
        for folder in (args.out, args.out / "compute", args.out / "network"):  # made by the builder, once it writes
            prepare_dir(folder, "--out", fix="allowed: a folder for compute/ and network/", create=False)


@cli_entry
def main(argv=None) -> int:
    from kvstudy.config.validate import check_group, one_line_parser

    parser = one_line_parser()(prog="python -m kvstudy.profiles", description=__doc__)  # usage errors: one line
    sub = parser.add_subparsers(dest="command", required=True)
    cal = sub.add_parser("calibrate", help="fit efficiencies to a GPU's real Vidur measurements (a100, h100)")
    cal.add_argument("--vidur-data", type=Path, default=SHARED_REFERENCE / "vidur-data")
    cal.add_argument("--device", default="a100", help=f"the measured GPU: {', '.join(CALIBRATED)}")
    cal.add_argument("--out", type=Path, default=None,
                     help="default profiles/calibration.json (a100), profiles/calibration_<device>.json")
    build = sub.add_parser("build", help="write Vidur-schema CSVs for every conf/model/*.yaml")
    build.add_argument("--out", type=Path, default=PROFILES_DIR)
    build.add_argument("--models", nargs="*", default=None,
                       help="model config names, or paths of model YAMLs outside the checkout (default: all of conf/model)")
    build.add_argument("--calibration", type=Path, default=None,
                       help="default: the calibration the device rests on (kvstudy/profiles/devices.py)")
    build.add_argument("--device", default=None,
                       help=f"GPU: {', '.join(DEVICES)} ({', '.join(CALIBRATED)} calibrated on their own measurements; "
                            "the others on a calibrated GPU's fit with their own datasheet peaks: uncalibrated); "
                            "default: the calibration's own GPU (a100 with the default --calibration)")
    args = parser.parse_args(argv)
    _check_paths(args)
    if args.command == "calibrate":
        from kvstudy.profiles.calibration import write_calibration

        result = write_calibration(args.vidur_data, args.out, args.device)
        print(json.dumps(result["mlp_errors"], indent=1))
        print(f"wrote {args.out}")
        return 0
    from kvstudy.profiles.builder import build_model, build_network
    from kvstudy.profiles.calibration import load_calibration

    try:
        calib = load_calibration(args.calibration)
    except ValueError as exc:  # not JSON
        raise DataError(f"--calibration {args.calibration}: not a calibration file ({exc}); allowed: the JSON "
                        f"`python -m kvstudy.profiles calibrate` writes") from None
    names = args.models or sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
    archs = [load_model_arch(name) for name in names]  # every model checked before the first file is written
    for arch in archs:
        check_group("model", asdict(arch))
    gpu = device(args.device or calib["device"])
    if gpu.calibration != calib["device"]:  # before anything is written or said of the device
        raise ConfigError(f"--device {gpu.name} rests on the {gpu.calibration} calibration, not the {calib['device']} "
                          f"one in --calibration {args.calibration}; allowed: "
                          f"{calibration_file(gpu.calibration).relative_to(REPO_ROOT)} (the default)")
    if not gpu.calibrated:
        print(f"{gpu.name}: uncalibrated (no measurement of this GPU: the {gpu.calibration} fit's efficiencies with "
              f"{gpu.name}'s datasheet peaks: {gpu.source})")
    started = time.perf_counter()
    from kvstudy.errors import phase  # Ctrl-C or a full disk here: one line naming the phase (kvstudy/errors.py)

    with phase(f"building {gpu.name} profiles into {args.out}", "each file listed above is whole, the others are "
               "not written; the same command builds them all again"):
        for arch in archs:
            for path in build_model(arch, calib, args.out, device=gpu.name):
                print(f"wrote {path}")
        for path in build_network(calib, args.out):
            print(f"wrote {path}")
    print(f"built {len(archs)} model(s) on {gpu.name} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
