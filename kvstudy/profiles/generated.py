"""Profiles of a device built on first use, into the cache (for GPUs whose profiles the repository does not carry).

The repository's ``profiles/`` carries A100's (and L4's Llama-3.2-1B) compute profiles; every other device of
``devices.DEVICES`` (H100, H200, A40, L4) is built by the same deterministic builder the first time a run asks for
it (about a second per model), into ``<cache>/profiles/<key>/compute/<device>/<model>/``, ``key`` a hash of
everything the files depend on: the calibration file, the model's architecture and the builder's code. It is the
file ``python -m kvstudy.profiles build --device D --models M`` would write, byte for byte (a test checks it);
that command writes it into ``profiles/`` instead, where a run finds it first.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from kvstudy.costs.arch import ModelArch

_CODE = ("builder.py", "calibration.py", "devices.py", "gpu_model.py")


def _key(arch: ModelArch, calibration: Path) -> str:
    digest = hashlib.sha256(calibration.read_bytes())
    digest.update(arch.fingerprint().encode())
    here = Path(__file__).parent
    for name in _CODE:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


def compute_dir(arch: ModelArch, device_name: str) -> Path:
    """The folder holding ``mlp.csv`` and ``attention.csv`` of ``arch`` on ``device_name``, built if missing."""
    from kvstudy.profiles.builder import build_model
    from kvstudy.profiles.calibration import calibration_file, load_calibration
    from kvstudy.profiles.devices import device
    from kvstudy.running.paths import cache_dir, prepare_cache

    gpu = device(device_name)
    calibration = calibration_file(gpu.calibration)
    root = cache_dir() / "profiles" / _key(arch, calibration)
    folder = root / "compute" / gpu.name / arch.name
    if not ((folder / "mlp.csv").exists() and (folder / "attention.csv").exists()):
        prepare_cache(folder)
        state = "calibrated" if gpu.calibrated else f"uncalibrated: {gpu.calibration}'s fit with {gpu.name}'s datasheet peaks"
        print(f"building {gpu.name} profiles of {arch.name} ({state}) into {folder}", file=sys.stderr, flush=True)
        build_model(arch, load_calibration(calibration), root, device=gpu.name)  # each file written atomically
    return folder
