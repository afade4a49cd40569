"""Loading a finished run's folder: its summary, its tables (requests, iterations; events and batches with
``record.events=true``) and its resolved config."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from kvstudy.errors import ConfigError


@dataclass
class Run:
    folder: Path
    summary: dict

    @property
    def requests(self) -> pd.DataFrame:
        return pd.read_parquet(self.folder / "requests.parquet")

    @property
    def iterations(self) -> pd.DataFrame:
        return pd.read_parquet(self.folder / "iterations.parquet")

    @property
    def events(self) -> pd.DataFrame:
        """events.parquet (a run with ``record.events=true``; kvstudy/engine/events.py)."""
        return self._optional("events")

    @property
    def batches(self) -> pd.DataFrame:
        """batches.parquet: each iteration's requests (a run with ``record.events=true``)."""
        return self._optional("batches")

    def _optional(self, name: str) -> pd.DataFrame:
        path = self.folder / f"{name}.parquet"
        if not path.exists():
            raise ConfigError(f"{self.folder}: no {name}.parquet; run with record.events=true to record it")
        return pd.read_parquet(path)

    @property
    def config(self) -> Optional[DictConfig]:
        path = self.folder / "resolved_config.yaml"
        return OmegaConf.load(path) if path.exists() else None


def load_run(folder) -> Run:
    folder = Path(folder)
    path = folder / "summary.json"
    if not path.exists():
        raise ConfigError(f"{folder}: no summary.json (the run did not finish or this is not a run folder)")
    if path.is_dir():
        raise ConfigError(f"{path}: a folder, not the run's summary file; this is not a run kvstudy wrote")
    try:
        summary = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc}); kvstudy writes it atomically, so another program changed "
                          f"it: delete the folder and run again") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"{path}: not a run summary (a JSON object); delete the folder and run again")
    return Run(folder, summary)
