"""Hydra finds sweepers and launchers only in the ``hydra_plugins`` namespace: this registers kvstudy's
(``kvstudy/running/sweep_launcher.py``), the defaults for ``python -m kvstudy -m``."""
from kvstudy.running.sweep_launcher import BatchLauncher, LightSweeper


class KvstudyLauncher(BatchLauncher):
    """``hydra/launcher=kvstudy``: many runs per worker process."""


class KvstudySweeper(LightSweeper):
    """``hydra/sweeper=kvstudy``: Hydra's basic sweeper, checking one composition per choice of config groups."""
