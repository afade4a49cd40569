"""Atomic file writes: write to a temporary file in the same folder, then rename over the target, so a
reader (or a resumed sweep) sees either the old file or the complete new one, never a partial file."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def write_atomic(path, write: Callable[[str], None]) -> None:
    """``write(tmp_path)`` fills a temporary file that then replaces ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path, text: str) -> None:
    write_atomic(path, lambda tmp: Path(tmp).write_text(text))
