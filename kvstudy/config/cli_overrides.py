"""The command line of ``python -m kvstudy`` before Hydra sees it: the policy's keys on a sweep that chooses the
policy. (Output folders are checked by the sweep callback before Hydra makes them: kvstudy/running/sweep_callback.py.)

A sweep over policies (``-m +policy=rr,rr_sjf``, ``+algo=a,b``, or an experiment whose sweep lists either) has no policy when
Hydra composes its primary config, so a ``policy.K=V`` there fails with "Key 'policy' is not in struct". Such a key
is passed on as ``++policy.K=V``; kvstudy's launcher (kvstudy/running/sweep_launcher.py) sets it in the runs whose policy
has the key and names, once, the policies that have no such setting (they run without it, and their folders are
named without it, so runs that would be the same run once). Other launchers
(``hydra/launcher=joblib``) fail those runs alone with "not a setting of policy ...".
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from omegaconf import OmegaConf

from kvstudy.running.paths import CONF_DIR
from kvstudy.config.validate import search_dirs, split_command_line


#: groups whose option chooses the policy: ``policy`` itself, and ``algo`` (Table 1's algorithms, each a policy)
POLICY_GROUPS = ("policy", "algo")


def _experiment_sweeps_policy(name: str, argv: List[str]) -> bool:
    for folder in [CONF_DIR] + list(search_dirs(argv)):
        path = Path(folder) / "experiment" / f"{name}.yaml"
        if path.is_file():
            params = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params", default=None) or {}
            return any(str(k).lstrip("+") in POLICY_GROUPS for k in params)
    return False


def policy_is_swept(argv: List[str]) -> bool:
    """True if the policy is chosen by the sweep (``+policy=a,b``, ``+algo=a,b``, or an experiment's sweep of
    either), not once for all."""
    swept = False
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+") in POLICY_GROUPS and key.startswith("+"):
            if "," not in value and "(" not in value:
                return False  # one policy for every run: its keys compose as usual
            swept = True
        elif key == "+experiment" and _experiment_sweeps_policy(value, argv):
            swept = True
    return swept


def command_line(argv: List[str]) -> List[str]:
    """``argv`` as Hydra should see it (module docstring): the overrides first, then Hydra's flags as its own parser
    read them (``--cfg job +policy=mcsf`` is ``+policy=mcsf --cfg=job``: argparse takes overrides after a flag's
    value only if no override came before it, kvstudy/config/validate.py ``split_command_line``)."""
    argv, flags, _ = split_command_line(argv)
    if policy_is_swept(argv):
        argv = [f"++{arg}" if arg.startswith("policy.") and "=" in arg else arg for arg in argv]
    return argv + flags
