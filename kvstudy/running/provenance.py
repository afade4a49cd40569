"""Where a result came from (summary.json's ``provenance``) and the fingerprint a resumed run is compared by.

A finished run is skipped on a re-run only if its config *and* its code fingerprint match (``resume=code``, the
default): the fingerprint hashes the code of kvstudy's modules that make results (not their docstrings or
comments; ``NOT_RESULTS`` names the modules left out), the Python files of a policy loaded from outside
kvstudy (its module's folder, or its package: helpers and parent classes there count) and the profile files the
latency model reads. ``resume=config`` skips a
finished run of the same config whatever the code (the behaviour before issue 35, e.g. for runs written before
fingerprints existed); ``resume=never`` re-runs it. Modules a user's policy imports from elsewhere (another folder, an installed package) are
not hashed: ``resume=never`` re-runs after changing them.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Iterable, Optional

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # kvstudy/
RESUME_MODES = ("code", "config", "never")


#: kvstudy's modules that cannot change a run's results (they read results, print, drive commands, or are other
#: studies; the profiles the builder writes are hashed as files): left out of the code digest, so editing them does
#: not make every finished run stale
NOT_RESULTS = ("reproduce.py", "analysis.py", "timeline.py", "sweep_callback.py", "__main__.py", "optimum/",
               "profiles/")


def _code(path: Path) -> bytes:
    """A module's code without its docstrings and comments (its AST), so that editing prose re-runs nothing."""
    import ast

    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return path.read_bytes()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False).encode()


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256, computed once per process (the code a process runs is the code it imported), over what a run's
    results depend on besides its resolved config: the code of kvstudy's modules that make results (``NOT_RESULTS``
    aside; docstrings and comments left out), the data files shipped inside the package (the Arena request set),
    every config file's content (comments left out: a policy's set-up composes other configs, e.g. CacheOPT's SLO
    reference runs, whose values are not in the run's own resolved config) and the vidur version.

    Parsing all of that takes ~0.7 s of CPU, paid by every run's process (a sweep's every worker, every test that
    starts ``python -m kvstudy``), so the digest is also kept in the predictor cache (``cache_dir()/code``) under the
    name, size and modification time of every file it reads: an edited, added or removed file is a new name there,
    and the digest is computed again (a cache that cannot be read or written: computed every time, as before)."""
    from kvstudy.running.paths import CONF_DIR

    modules = []
    for path in sorted(PACKAGE_DIR.rglob("*")):
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        if not path.is_file() or "__pycache__" in rel or \
                any(rel == x or rel.endswith("/" + x) or (x.endswith("/") and rel.startswith(x)) for x in NOT_RESULTS):
            continue
        modules.append((rel, path))
    configs = [(path.relative_to(CONF_DIR).as_posix(), path) for path in sorted(CONF_DIR.rglob("*.yaml"))]
    vidur = str(_version("vidur"))
    stamp = hashlib.sha256(repr((str(PACKAGE_DIR), str(CONF_DIR), vidur,
                                 [(rel, _stat(path)) for rel, path in modules + configs])).encode())
    memo = _memo_file(stamp.hexdigest()[:32])
    try:
        kept = memo.read_text() if memo else ""
    except OSError:
        kept = ""
    if len(kept) == 64 and all(c in "0123456789abcdef" for c in kept):
        return kept
    digest = _code_digest(modules, configs, vidur)
    if memo:
        from kvstudy.running.atomic import write_text_atomic

        try:
            write_text_atomic(memo, digest)  # a reader sees the whole digest or none
        except OSError:
            pass
    return digest


def _stat(path: Path) -> tuple:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _memo_file(name: str) -> Optional[Path]:
    """Where ``code_digest`` keeps a digest: the predictor cache's ``code/`` folder, or None if it cannot be named."""
    from kvstudy.running.paths import cache_dir

    try:
        return cache_dir() / "code" / name
    except Exception:  # a cache path that cannot be a folder is reported when a predictor needs it, not here
        return None


def _code_digest(modules, configs, vidur: str) -> str:
    from omegaconf import OmegaConf

    h = hashlib.sha256()
    for rel, path in modules:
        h.update(rel.encode())
        h.update(_code(path) if path.suffix == ".py" else path.read_bytes())
    for rel, path in configs:
        h.update(rel.encode())
        try:
            h.update(repr(OmegaConf.to_container(OmegaConf.load(path), resolve=False)).encode())
        except Exception:  # a file Hydra would refuse anyway
            h.update(path.read_bytes())
    h.update(vidur.encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=512)
def _digest(path: str, mtime_ns: int, size: int, code: bool) -> str:
    return hashlib.sha256(_code(Path(path)) if code else Path(path).read_bytes()).hexdigest()


def file_digest(path, code: bool = False) -> str:
    """sha256 of a file's bytes (``code``: of a Python module's code, ``_code``), cached until the file changes."""
    st = Path(path).stat()
    return _digest(str(path), st.st_mtime_ns, st.st_size, code)


#: at most this many files of a user's folder are hashed (a module living in a huge folder: only its own file)
MAX_USER_FILES = 500


def _user_sources(module: str, origin: Path) -> list:
    """The Python files a user's policy module may depend on: its top-level package's (recursively) if it is in a
    package, else every ``.py`` file beside it (helpers, a parent class in a sibling module)."""
    top = module.split(".")[0]
    package = origin.name == "__init__.py"
    folder = origin.parent.parent if package else origin.parent  # the folder holding the module (or package)
    for _ in range(module.count(".")):
        folder = folder.parent  # from a.b.c up to the folder holding package a
    if module.count(".") or package:
        files = sorted((folder / top).rglob("*.py")) if (folder / top).is_dir() else [origin]
    else:
        files = sorted(folder.glob("*.py"))
    return files if len(files) <= MAX_USER_FILES else [origin]


def user_module(target: Optional[str]) -> Optional[dict]:
    """A ``_target_`` that lives outside kvstudy (a user's policy): its module, file, and the digest of the Python
    files beside it (``_user_sources``: an edit to a helper module or a parent class there counts); None for
    kvstudy's own (covered by ``code_digest``) or a target that cannot be located."""
    if not target or "." not in target:
        return None
    module = target.rsplit(".", 1)[0]
    if module == "kvstudy" or module.startswith("kvstudy."):
        return None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return None
    h = hashlib.sha256()
    files = _user_sources(module, Path(spec.origin))
    for path in files:
        h.update(path.name.encode())
        h.update(file_digest(path, code=True).encode())
    return {"module": module, "file": spec.origin, "files_hashed": len(files), "sha256": h.hexdigest()}


@functools.lru_cache(maxsize=1)
def _git() -> dict:
    root = PACKAGE_DIR.parent
    if not (root / ".git").exists():
        return {"commit": None, "dirty": None}
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                 "kvstudy", "conf", "profiles"], capture_output=True, text=True, timeout=10)
        return {"commit": commit, "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _version(package: str) -> Optional[str]:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def fingerprint(policy_target: Optional[str], profile_paths: Iterable = ()) -> str:
    """What a finished run's results depend on beyond its config: kvstudy's code, a user policy's source file, the
    latency model's profile files (16 hex digits)."""
    h = hashlib.sha256(code_digest().encode())
    mod = user_module(policy_target)
    if mod:
        h.update(mod["sha256"].encode())
    for p in profile_paths:
        h.update(file_digest(p).encode())
    return h.hexdigest()[:16]


def record(policy_target: Optional[str], profile_paths: Iterable = (), latency: Optional[dict] = None) -> dict:
    """summary.json's ``provenance``: versions, commit (and whether kvstudy/, conf/ or profiles/ had uncommitted
    changes), Python, the profile files' sha256, the predictor's cache key, a user policy's file, the fingerprint."""
    paths = [Path(p) for p in profile_paths]
    git = _git()
    return {"kvstudy_version": _version("kvstudy"), "kvstudy_commit": git["commit"], "kvstudy_dirty": git["dirty"],
            "vidur_version": _version("vidur"), "python": platform.python_version(),
            "code_sha256": code_digest()[:16],
            "profiles": {str(p): file_digest(p)[:16] for p in paths},
            "predictor_cache_key": (latency or {}).get("cache_key"),
            "policy_module": user_module(policy_target),
            "fingerprint": fingerprint(policy_target, paths)}
