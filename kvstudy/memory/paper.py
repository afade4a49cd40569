"""The MC-SF paper's memory model (Jaillet et al., Sec. 2, IP constraint (3)).

KV is counted in tokens: a request that has produced j tokens holds s + j of them; the iteration that
admits a prompt is not charged. The accounting itself lives in :class:`kvstudy.engine.Engine`, whose loop
is built around it (eq. (5) checks, overflow clearing); this class only carries and checks the setting.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvstudy.errors import ConfigError


@dataclass(frozen=True)
class PaperMemory:
    capacity_tokens: int
    name: str = "paper"
    #: preemption modes this model can carry out: eviction = recompute from scratch (the paper's clearing)
    modes = ("recompute",)

    def __post_init__(self) -> None:
        if int(self.capacity_tokens) <= 0:
            raise ConfigError(f"memory.capacity_tokens={self.capacity_tokens}: must be a positive number of tokens")
