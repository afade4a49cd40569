"""Where the repository's own folders are (kvstudy is installed editable: ``pip install -e .``)."""
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
PROFILES_DIR = REPO_ROOT / "profiles"
CALIBRATION_FILE = PROFILES_DIR / "calibration.json"
#: Real Vidur data and traces for calibration and tests; never copied into the repository.
SHARED_REFERENCE = Path(os.environ.get("KVSTUDY_SHARED", REPO_ROOT.parent / "shared" / "reference"))


def cache_dir() -> Path:
    """Trained-predictor cache; override with KVSTUDY_CACHE_DIR."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvstudy"
    return Path(os.environ.get("KVSTUDY_CACHE_DIR", default))


def load_model_arch(name: str):
    """The ModelArch of ``conf/model/<name>.yaml``, or of a model YAML anywhere given by its path (``my/llama.yaml``):
    a user's own model needs no file in the checkout (``python -m kvstudy.profiles build --models my/llama.yaml``,
    then ``hydra.searchpath=[file:///my/conf] model=llama`` with the YAML in ``/my/conf/model/``)."""
    from omegaconf import OmegaConf

    from kvstudy.arch import ModelArch
    from kvstudy.errors import ConfigError

    path = Path(name) if name.endswith((".yaml", ".yml")) else CONF_DIR / "model" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
        raise ConfigError(f"unknown model '{name}'; allowed: {', '.join(known)}")
    return ModelArch.from_mapping(OmegaConf.to_container(OmegaConf.load(path)))
