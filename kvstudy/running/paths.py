"""Where the repository's own folders are (kvstudy is installed editable: ``pip install -e .``), the predictor cache,
and the one place every command prepares an output folder or file before any work starts (``prepare_dir``,
``prepare_file``: a mistake is one ``error:`` line, status 2)."""
import os
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
PROFILES_DIR = REPO_ROOT / "profiles"
CALIBRATION_FILE = PROFILES_DIR / "calibration.json"
#: Real Vidur data and traces for calibration and tests; never copied into the repository.
SHARED_REFERENCE = Path(os.environ.get("KVSTUDY_SHARED", REPO_ROOT.parent / "shared" / "reference"))


def shown_path(path) -> str:
    """A run's or sweep's folder as the commands print it (``outputs: ...``, ``sweep done: ...``): relative to the
    current folder when it is inside it, as the README writes ``outputs/runs/...``; otherwise absolute (issue 54)."""
    target = Path(os.path.abspath(path))
    try:
        return str(target.relative_to(os.getcwd()))
    except ValueError:
        return str(target)


def cache_dir() -> Path:
    """Trained-predictor cache; override with KVSTUDY_CACHE_DIR. A path that cannot be a folder (a file, or a path
    under a file) is a ConfigError here, before any predictor is trained; whether it is writable is asked only when a
    predictor is about to be trained into it (``prepare_cache``): a read-only cache that holds the tables is fine."""
    path, name = _cache_path()
    _check_folder(path, _label(path, name), _CACHE_FIX, writable=False)
    return path


_CACHE_FIX = "set KVSTUDY_CACHE_DIR to a folder kvstudy can write"


def _cache_path():
    if os.environ.get("KVSTUDY_CACHE_DIR"):
        return Path(os.environ["KVSTUDY_CACHE_DIR"]), "KVSTUDY_CACHE_DIR"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvstudy", None


def prepare_cache(folder) -> Path:
    """``folder`` (inside ``cache_dir()``) made, before a predictor is trained into it; a mistake names the cache."""
    path, name = _cache_path()
    return prepare_dir(folder, fix=_CACHE_FIX, label=_label(path, name))


# --- output paths: the one place every command prepares a folder or file it will write ---------------------------
def _label(path, name: Optional[str]) -> str:
    """How the user named the path: ``--out PATH`` (a flag), ``out=PATH`` / ``hydra.run.dir=PATH`` (a key, or an
    environment variable), or the path alone."""
    if not name:
        return str(path)
    return f"{name} {path}" if name.startswith("-") else f"{name}={path}"


def _shown(here: Path, given: Path) -> str:
    """An ancestor of ``given`` (made absolute) as the user would write it: relative if ``given`` is."""
    return str(here) if given.is_absolute() else os.path.relpath(here)


def _check_folder(path: Path, label: str, fix: str, writable: bool = True, inside: bool = False) -> None:
    """Can ``path`` be (or become) a folder kvstudy writes into? ``inside``: ``path`` is the folder of the file
    ``label`` names, so the messages speak of that file."""
    from kvstudy.errors import ConfigError

    target = Path(os.path.abspath(path))
    here = target
    while not os.path.exists(here) and here.parent != here:  # the nearest part of the path that is there
        here = here.parent  # (os.path's tests: False, not an exception, under a folder that cannot be searched)
    _check_lengths(target, here, label, fix)
    if not os.path.isdir(here):
        what = "is a file, not a folder" if here == target and not inside else \
            f"lies under {_shown(here, Path(path))}, a file, not a folder"
        if os.path.exists(here) and not os.path.isfile(here):
            what = what.replace("a file, not", "not a regular file, nor")
        raise ConfigError(f"{label}: {what}; {fix}")
    if writable and not os.access(here, os.W_OK | os.X_OK):
        if here == target:
            where = "not writable" if not inside else f"its folder {_shown(here, Path(path))} is not writable"
        else:
            where = f"cannot be created: {_shown(here, Path(path))} is not writable"
        raise ConfigError(f"{label}: {where}; {fix}")


def _check_lengths(target: Path, here: Path, label: str, fix: str) -> None:
    """Each name of ``target`` within the file system's limit (NAME_MAX, 255 bytes on ext4, xfs, tmpfs) and the whole
    path within PATH_MAX (4096): else one line, before any work (issue 54: a 300-character name reached the user as
    ``OSError: [Errno 36] File name too long`` after the run)."""
    from kvstudy.errors import ConfigError

    try:
        name_max, path_max = os.pathconf(here, "PC_NAME_MAX"), os.pathconf(here, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in target.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise ConfigError(f"{label}: the name '{part[:24]}...' is {size} bytes, more than the {name_max} this "
                              f"file system allows for one name; {fix}")
    if len(os.fsencode(str(target))) >= path_max:
        raise ConfigError(f"{label}: {len(os.fsencode(str(target)))} bytes, more than the {path_max - 1} this "
                          f"file system allows for a path; {fix}")


def prepare_dir(path, name: Optional[str] = None, fix: str = "choose another folder", create: bool = True,
                label: Optional[str] = None, writable: bool = True) -> Path:
    """The one check of an output folder, made before any work starts: ``path`` must be a folder, or creatable as one
    (no part of it a file), and writable. Each mistake is a ``ConfigError`` of one line, ``<name>=<path>: <what is
    wrong>; <fix>`` (``--out <path>`` for a flag, the path alone without ``name``), which every command prints as
    ``error: ...`` with status 2. ``create``: the folder is made (else it is only checked, for a caller that makes it
    later); ``writable=False`` (with ``create=False``) leaves out whether it can be written, for a caller that may
    only read it. Returns ``Path(path)``."""
    from kvstudy.errors import ConfigError

    path = Path(path)
    label = label or _label(path, name)
    _check_folder(path, label, fix, writable=writable or create)
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a read-only file system, a name too long, a broken link on the way
            raise ConfigError(f"{label}: cannot be created ({exc.strerror or exc}); {fix}") from None
    return path


def prepare_file(path, name: Optional[str] = None, overwrite: bool = True, fix: str = "choose another file",
                 exists_fix: Optional[str] = None, create: bool = True) -> Path:
    """The one check of an output file, made before any work starts: ``path`` must not be a folder (nor a pipe or
    device), its folder is prepared as ``prepare_dir`` prepares one (no file on the way, writable; made with
    ``create``), and unless ``overwrite`` it must not exist yet (``exists_fix`` says what to do then). Mistakes are
    one-line ``ConfigError``s as ``prepare_dir``'s. Returns ``Path(path)``."""
    from kvstudy.errors import ConfigError

    path = Path(path)
    label = _label(path, name)
    if os.path.isdir(path):
        raise ConfigError(f"{label}: a directory; {fix}")
    there = os.path.exists(path)
    if there and not os.path.isfile(path):
        raise ConfigError(f"{label}: not a regular file (a pipe, socket or device); {fix}")
    if there and not overwrite:
        raise ConfigError(f"{label}: exists; {exists_fix or fix}")
    folder = path.parent
    _check_folder(folder, label, fix, inside=True)
    if there and not os.access(path, os.W_OK):
        raise ConfigError(f"{label}: not writable; {fix}")
    if create:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{label}: its folder cannot be created ({exc.strerror or exc}); {fix}") from None
    return path


def load_model_arch(name: str):
    """The ModelArch of ``conf/model/<name>.yaml``, or of a model YAML anywhere given by its path (``my/llama.yaml``):
    a user's own model needs no file in the checkout (``python -m kvstudy.profiles build --models my/llama.yaml``,
    then ``hydra.searchpath=[file:///my/conf] model=llama`` with the YAML in ``/my/conf/model/``)."""
    from omegaconf import OmegaConf

    from kvstudy.costs.arch import ModelArch
    from kvstudy.errors import ConfigError

    path = Path(name) if name.endswith((".yaml", ".yml")) else CONF_DIR / "model" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
        raise ConfigError(f"unknown model '{name}'; allowed: {', '.join(known)}")
    return ModelArch.from_mapping(OmegaConf.to_container(OmegaConf.load(path)))
