"""Profiles of a device built on first use, into the cache (for GPUs whose profiles the repository does not carry).

The repository's ``profiles/`` carries A100's compute profiles of the shipped models (and L4's Llama-3.2-1B); any
other (device, model) of ``devices.DEVICES`` a run asks for (H100, H200, A40, L4, or a model of one's own on A100) is
built by the same deterministic builder the first time (about a second per model, one line on stderr saying so),
into ``<cache>/profiles/<key>/compute/<device>/<model>/``, ``key`` a hash of everything the files depend on: the
calibration file, the model's architecture and the builder's code as this process loaded it. It is the
file ``python -m kvstudy.profiles build --device D --models M`` would write, byte for byte (a test checks it);
that command writes it into ``profiles/`` instead, where a run finds it first.

Each built folder carries ``manifest.json`` (every file's size and SHA-256), written atomically after the files, and
checked on every use, as ``tables.npz`` is checked when it is loaded (issue 54: a truncated CSV in the cache trained a
predictor without a word). A file that does not match is rebuilt, said in one warning line naming it; a folder
without a manifest (an older kvstudy's) is rebuilt quietly, the files being the same bytes.
"""
from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path
from typing import Optional

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
    damage = damaged(folder)
    if damage is not None:
        if damage:
            warnings.warn(f"{damage}: damaged profile cache; rebuilding it", stacklevel=2)
        prepare_cache(folder)
        state = "calibrated" if gpu.calibrated else f"uncalibrated: {gpu.calibration}'s fit with {gpu.name}'s datasheet peaks"
        print(f"building {gpu.name} profiles of {arch.name} ({state}) into {folder}", file=sys.stderr, flush=True)
        from kvstudy.errors import file_system, phase

        with phase(f"building {gpu.name} profiles of {arch.name} into {folder}",
                   "the cache keeps only whole files; the next run builds them again"), \
                file_system(folder, "free space there or set KVSTUDY_CACHE_DIR to a folder on another disk"):
            paths = build_model(arch, load_calibration(calibration), root, device=gpu.name)  # each file atomically
            write_manifest(folder, [Path(p).name for p in paths])
    return folder


MANIFEST = "manifest.json"
PROFILE_FILES = ("mlp.csv", "attention.csv")


def _entry(path: Path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_manifest(folder: Path, names) -> None:
    """``manifest.json``: each file's size and SHA-256, written atomically once the files are (module docstring)."""
    from kvstudy.running.atomic import write_text_atomic

    folder = Path(folder)
    write_text_atomic(folder / MANIFEST, json.dumps({n: _entry(folder / n) for n in sorted(names)}, indent=1) + "\n")


def damaged(folder: Path) -> Optional[str]:
    """None if ``folder`` holds the profile files its manifest lists, whole; else what to rebuild: ``""`` when there
    is nothing to check against (no files yet, or no manifest: an older kvstudy's folder), else the first file (or
    the manifest) that does not match, with how."""
    folder = Path(folder)
    if not all((folder / n).is_file() for n in PROFILE_FILES):
        return ""
    path = folder / MANIFEST
    if not path.exists():
        return ""
    stamp = tuple((p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino) for p in
                  [path, *(folder / n for n in PROFILE_FILES)])
    if _CHECKED.get(folder) == stamp:  # checked in this process, unchanged since: a sweep's runs hash it once
        return None
    try:
        manifest = json.loads(path.read_text())
        listed = {n: (int(manifest[n]["bytes"]), str(manifest[n]["sha256"])) for n in PROFILE_FILES}
    except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError) as exc:
        return f"{path} ({type(exc).__name__})"
    for name, (size, digest) in listed.items():
        entry = _entry(folder / name)
        if entry["bytes"] != size:
            return f"{folder / name} ({entry['bytes']} bytes, {size} when built)"
        if entry["sha256"] != digest:
            return f"{folder / name} (its SHA-256 is not the one recorded when it was built)"
    _CHECKED[folder] = stamp
    return None


#: folders found whole in this process, with their files' (size, mtime, inode) then
_CHECKED: dict = {}
