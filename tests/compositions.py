"""Hydra compositions made once per machine and code, shared by pytest-xdist's workers.

Parametrized tests that compose configs at collection (every option of every group, every policy) paid ~0.3 s of CPU
per composition in each worker: ~20 s per worker for tests/config/test_bad_input_property.py, ~17 s for
tests/policies/test_conformance.py (issue 54's test-time budget). A composition is a pure function of the configs, the code and
the Hydra / OmegaConf versions, so the first worker's results, stored under a digest of all of them in the temp folder
(locked files, written atomically), are the ones every other worker would make; the workers share the composing out
(``compose_each``)."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pickle
import sys
import tempfile
from pathlib import Path

from kvstudy.running.paths import CONF_DIR, REPO_ROOT


def sources_digest() -> str:
    """Every config and every module of kvstudy (and its Hydra plugins), by content, with the versions."""
    import hydra
    import omegaconf

    h = hashlib.sha256(f"{sys.version} {hydra.__version__} {omegaconf.__version__}".encode())
    for root in (CONF_DIR, REPO_ROOT / "kvstudy", REPO_ROOT / "hydra_plugins"):
        for path in sorted(root.rglob("*")):
            if path.suffix in (".py", ".yaml") and path.is_file():
                h.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:20]


def compose_each(name: str, override_lists) -> dict:
    """{tuple(overrides): api.compose(overrides)} for every list, made in chunks that the workers share out: a worker
    takes each chunk no other worker holds (a non-blocking lock), composes it and stores it, then reads the chunks
    the others made (waiting for their locks), so two workers compose half each instead of both composing all."""
    from kvstudy import api

    keys = [tuple(o) for o in override_lists]
    folder, digest = Path(tempfile.gettempdir()), sources_digest()
    out, deferred = {}, []
    for k in range(0, len(keys), CHUNK):
        chunk = keys[k:k + CHUNK]
        path = folder / f"kvstudy-test-{name}-{digest}-{k // CHUNK}.pkl"
        lock = open(path.with_suffix(".lock"), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another worker is composing it
            deferred.append((chunk, path, lock))
            continue
        with lock:
            out.update(_read_or_make(path, chunk, api.compose))
    for chunk, path, lock in deferred:
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            out.update(_read_or_make(path, chunk, api.compose))
    return {key: out[key] for key in keys}  # in the order asked, whichever worker composed what (xdist compares)


CHUNK = 8  # compositions per stored file (~2.5 s of CPU)


def _read_or_make(path: Path, chunk, compose) -> dict:
    with contextlib.suppress(OSError, EOFError, pickle.UnpicklingError):
        made = pickle.loads(path.read_bytes())
        if list(made) == list(chunk):
            return made
    made = {key: compose(list(key)) for key in chunk}
    part = path.with_suffix(f".{os.getpid()}.part")
    part.write_bytes(pickle.dumps(made))
    os.replace(part, path)
    return made
