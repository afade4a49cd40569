"""Composing a config: the config ``python -m kvstudy <overrides>`` would run (Hydra's Compose API, no output folder),
one policy's config, and reading a composed config's nodes (as plain containers; a node's group, for messages)."""
from __future__ import annotations

from typing import Iterable

from hydra import compose as hydra_compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kvstudy.config.user_files import check_user_files
from kvstudy.config.validate import check_group_choices
from kvstudy.errors import ConfigError
from kvstudy.running.paths import CONF_DIR


def compose(overrides: Iterable[str] = ()) -> DictConfig:
    """The config ``python -m kvstudy <overrides>`` would run (Hydra Compose API, no output folder)."""
    overrides = list(overrides)
    check_group_choices(overrides)  # an unknown option of a group in one line, not Hydra's
    check_user_files(overrides)  # a user's own option file that Hydra's YAML parser would stop on, in one line
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"cannot compose the config from {' '.join(overrides)}: {first}") from None


def _composed(override: str, group: str) -> DictConfig:
    """The ``group`` node of the config ``override`` composes: inside a Hydra app (a sweep's run) through the app's
    own Hydra (a second initialisation is refused there)."""
    if GlobalHydra.instance().is_initialized():
        return hydra_compose(config_name="config", overrides=[override])[group]
    return compose([override])[group]


def compose_group(group: str, option: str) -> DictConfig:
    """conf/<group>/<option>.yaml as ``<group>=<option>`` composes it (a group with a default: memory, model, ...)."""
    return _composed(f"{group}={option}", group)


def compose_policy(name: str) -> DictConfig:
    """conf/policy/<name>.yaml as ``+policy=<name>`` composes it (policy has no default: it is added)."""
    return _composed(f"+policy={name}", "policy")


def plain(node) -> dict:
    """A config node as a plain dict, interpolations resolved (a plain mapping: a copy of it)."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def group_of(node: DictConfig) -> str:
    """The config key of ``node`` (memory, policy, ...), for messages."""
    try:
        return node._get_full_key(None) or "config"  # memory, policy, ...; memory.connector for a node inside one
    except Exception:
        return "config"


def policy_memory(name: str) -> DictConfig:
    """The ``memory`` node ``+policy=<name>`` composes (a policy's option may select its memory model: ``lpm`` takes
    ``paged_prefix``)."""
    return _composed(f"+policy={name}", "memory")
