"""Profiles of a device built on first use, into the cache (for GPUs whose profiles the repository does not carry).

The repository's ``profiles/`` carries A100's compute profiles of the shipped models (and L4's Llama-3.2-1B); any
other (device, model) of ``devices.DEVICES`` a run asks for (H100, H200, A40, L4, or a model of one's own on A100) is
built by the same deterministic builder the first time (about a second per model, one line on stderr saying so),
into ``<cache>/profiles/<key>/compute/<device>/<model>/``, ``key`` a hash of everything the files depend on: the
calibration file, the model's architecture and the builder's code as this process loaded it. It is the
file ``python -m kvstudy.profiles build --device D --models M`` would write, byte for byte (a test checks it);
that command writes it into ``profiles/`` instead, where a run finds it first.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from kvstudy.costs.arch import ModelArch

def _code_digest() -> bytes:
    """The builder's code (and the architecture arithmetic it uses), read once: the code this process runs, even if
    the checkout is edited during a sweep."""
    from kvstudy.costs import arch as arch_module

    here = Path(__file__).parent
    paths = [here / name for name in ("builder.py", "calibration.py", "devices.py", "gpu_model.py")]
    digest = hashlib.sha256()
    for path in paths + [Path(arch_module.__file__)]:
        digest.update(path.read_bytes())
    return digest.digest()


_CODE = _code_digest()


def _key(arch: ModelArch, calibration: Path) -> str:
    digest = hashlib.sha256(calibration.read_bytes())
    digest.update(arch.fingerprint().encode())
    digest.update(_CODE)
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
