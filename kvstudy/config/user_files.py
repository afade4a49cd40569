"""The user's own config files (``hydra.searchpath=[file:///my/conf] hardware=my_hw``), read before Hydra reads them.

Hydra loads a chosen option's YAML with PyYAML and lets its errors through: a syntax error, a tab, a byte that is not
UTF-8, a duplicate key or a ``!!python`` tag reach the user as a parser traceback, a file holding a YAML list fails
later as an interpolation that "cannot be resolved", and a key no kvstudy setting has (``hbm_gbps``) is merged in and
never read. ``check_user_files`` reads every option the command line chooses from a user's folder (and those a user's
experiment chooses) as Hydra would, and says what is wrong in one line naming the file and the line
(``read_config_file``), that the file is not a mapping, or the key that is no setting of its group with the settings
there are (the schema's, kvstudy/config/schema.py, for a group whose keys the schema knows). kvstudy's own ``conf/``
passes the same check (tests/config/test_campaign54_inputs.py), so only a user's mistake is refused. Also here: the user's
folders (``search_dirs``) and the options an override chooses as Hydra's parser reads them (``choice_values``).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

from omegaconf import OmegaConf

from kvstudy.config.schema import SCHEMA, key_spec
from kvstudy.errors import ConfigError
from kvstudy.running.paths import CONF_DIR

#: what a config file may be, said after each reading error
_ALLOWED = ("allowed: a UTF-8 YAML mapping of key: value lines (indented with spaces, not tabs; each key once; "
            "no !!python tags)")


def search_dirs(overrides: Iterable[str] = ()) -> list:
    """Config folders a user adds with Hydra's ``hydra.searchpath=[file:///my/conf]`` (their own models, hardware,
    policies in ``<folder>/<group>/<name>.yaml``), after kvstudy's own ``conf/``."""
    dirs = []
    for arg in overrides:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "hydra.searchpath":
            for item in value.strip("[]").split(","):
                item = item.strip().strip("'\"")
                if item.startswith("file://"):
                    dirs.append(Path(item[len("file://"):]))
    return dirs


@functools.lru_cache(maxsize=1)
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def choice_values(arg: str) -> Optional[List[str]]:
    """The options an override ``group=value`` chooses, as Hydra's parser reads them (a quoted ``'my hw'`` is
    ``my hw``; ``a,b`` and ``choice(a,b)`` both options); None for a value that is no list of names (``range(...)``,
    null, what the grammar cannot read)."""
    try:
        parsed = _parser().parse_overrides([arg])[0]
    except Exception:
        return None
    if parsed.is_sweep_override():
        return list(parsed.sweep_string_iterator()) if parsed.is_choice_sweep() else None
    value = parsed.value()
    return None if value is None or isinstance(value, (dict, list)) else [str(value)]


def _where(path: Path, mark) -> str:
    return f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(path)


def read_config_file(path: Path):
    """``path`` as Hydra's loader reads it (``OmegaConf.load``: PyYAML with duplicate keys refused); a file PyYAML
    cannot read is one ConfigError naming the file, the line and the parser's own words."""
    import yaml

    path = Path(path)
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}, line {line}: byte 0x{data[exc.start]:02x} is not UTF-8 text; save the file as "
                          f"UTF-8 ({_ALLOWED})") from None
    try:
        return OmegaConf.load(path)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        context = exc.context
        if context and exc.context_mark is not None and mark is not None and exc.context_mark.line != mark.line:
            context += f" at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1}"
        words = "; ".join(w for w in (context, exc.problem) if w)
        words = words.replace("tag:yaml.org,2002:", "!!")
        raise ConfigError(f"{_where(path, mark)}: cannot be read as YAML ({words}); {_ALLOWED}") from None
    except yaml.YAMLError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{path}: cannot be read as YAML ({first}); {_ALLOWED}") from None


def _parameters(target: str) -> Optional[List[str]]:
    """The parameters ``target`` (``module.Class``) takes; None if it takes ``**kwargs`` or cannot be imported here
    (the run names that, kvstudy/running/targets.py)."""
    import importlib
    import inspect

    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
            for name in parts[cut:]:
                obj = getattr(obj, name)
            params = inspect.signature(obj).parameters.values()
        except Exception:
            continue
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return None


def _key_lines(path: Path) -> dict:
    """Dotted key -> line number (1-based) of a YAML mapping, for messages."""
    import yaml

    out = {}

    def walk(node, prefix):
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                dotted = f"{prefix}.{key.value}" if prefix else str(key.value)
                out[dotted] = key.start_mark.line + 1
                walk(value, dotted)

    try:
        walk(yaml.compose(path.read_text()), "")
    except Exception:
        pass
    return out


def _leaf_keys(node, prefix: str = "") -> List[str]:
    out = []
    for key, value in node.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out += [dotted] + _leaf_keys(value, dotted)
        else:
            out.append(dotted)
    return out


def check_option_file(group: str, name: str, path: Path, dirs: tuple = ()) -> None:
    """One option file of ``group``: readable (``read_config_file``), a mapping, and (for a group whose keys the
    schema knows for this option's ``_target_`` or ``kind``) no key that is not a setting of the group."""
    cfg = read_config_file(path)
    node = OmegaConf.to_container(cfg, resolve=False)
    if node is None or node == {}:
        return
    if not isinstance(node, dict):
        kind = "list" if isinstance(node, list) else f"single value ({node!r})"
        raise ConfigError(f"{path}: a YAML {kind}, not a mapping; allowed: a mapping of {group} settings, one "
                          f"'key: value' per line (name: {name}, ...)")
    text = path.read_text()
    spec = SCHEMA.get(group)
    if spec is None or "@package" in text:
        return
    body = {k: v for k, v in node.items() if k != "defaults"}
    if spec.by:  # the option's _target_ or kind, its own or inherited through its defaults list
        by_value = _inherited(group, node, spec.by, tuple(str(d) for d in dirs))
        keys, known = spec.keys_for({spec.by: by_value})
        if not known:
            return  # an option of one's own (a _target_ the schema does not know): kvstudy/running/targets.py checks it
        params = _parameters(by_value) if spec.by == "_target_" and isinstance(by_value, str) else None
        keys = {**keys, **{p: None for p in params or () if p not in keys}}  # what its _target_ takes, too
    else:
        keys, _ = spec.keys_for(body)
    lines = _key_lines(path)
    for key in _leaf_keys(body):
        last = key.rsplit(".", 1)[-1]
        if last.startswith("_") or key in keys or key_spec(group, keys, key) is not None or \
                any(k.startswith(key + ".") or (k.endswith("*") and key.startswith(k[:-1])) for k in keys):
            continue
        shown = sorted(k for k in keys if not k.startswith("_"))
        line = f", line {lines[key]}" if key in lines else ""
        raise ConfigError(f"{path}{line}: {key} is not a setting of {group}; allowed: {', '.join(shown)}")


def _inherited(group: str, node: dict, key: str, dirs: tuple, depth: int = 0):
    """``key`` (``_target_``, ``kind``) of an option's ``node``, its own or from the options its defaults list
    inherits (``defaults: [paged_offload, _self_]``), found in kvstudy's ``conf/`` or the user's folders."""
    if node.get(key) is not None or depth > 8:
        return node.get(key)
    for entry in node.get("defaults") or []:
        if not isinstance(entry, str) or entry == "_self_":
            continue
        parent_group, _, parent = entry.lstrip("/").rpartition("/")
        parent_group = parent_group or group
        path = next((p for p in (Path(d) / parent_group / f"{parent}.yaml" for d in (str(CONF_DIR),) + dirs)
                     if p.is_file()), None)
        parent_node = OmegaConf.to_container(read_config_file(path), resolve=False) if path else None
        if isinstance(parent_node, dict):
            found = _inherited(parent_group, parent_node, key, dirs, depth + 1)
            if found is not None:
                return found
    return None


def _chosen(overrides: Iterable[str]) -> List[Tuple[str, str]]:
    """(group, option) the command line chooses (``hardware=my_hw``, ``+experiment=x``, a sweep's values)."""
    out = []
    for arg in overrides:
        key, sep, _ = arg.lstrip("+~").partition("=")
        if not sep or key.startswith("hydra") or "/" in key or "." in key:
            continue
        values = choice_values(arg)
        out += [(key, v) for v in values or ()]
    return out


def _user_file(group: str, name: str, dirs: List[Path]) -> Optional[Path]:
    """The file Hydra would load for ``group=name`` if it is a user's (kvstudy's own conf/ comes first)."""
    if (CONF_DIR / group / f"{name}.yaml").is_file():
        return None
    return next((p for p in (Path(d) / group / f"{name}.yaml" for d in dirs) if p.is_file()), None)


def check_user_files(overrides: Iterable[str]) -> None:
    """Every option of a user's folder (``hydra.searchpath``) that the command line chooses, and those the chosen
    options choose in turn (a user's experiment's defaults list), checked by ``check_option_file``."""
    overrides = list(overrides)
    dirs = search_dirs(overrides)
    if not dirs:
        return
    todo, seen = _chosen(overrides), set()
    while todo:
        group, name = todo.pop(0)
        if (group, name) in seen:
            continue
        seen.add((group, name))
        path = _user_file(group, name, dirs)
        if path is None:
            continue
        check_option_file(group, name, path, tuple(dirs))
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        for entry in (node.get("defaults") or []) if isinstance(node, dict) else []:
            if isinstance(entry, dict):
                for key, value in entry.items():
                    key = str(key).strip()
                    key = key[len("override "):].strip() if key.startswith("override ") else key
                    if isinstance(value, str):
                        todo.append((key.lstrip("/").split("@")[0], value))
            elif isinstance(entry, str) and entry != "_self_":
                parent_group, _, parent = entry.lstrip("/").rpartition("/")
                todo.append((parent_group or group, parent))
