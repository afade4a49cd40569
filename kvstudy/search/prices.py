"""What a deployment costs per hour (issue 58): a table of on-demand prices per GPU and hour, each with its source and
date, and a deployment's cost from its replicas' hardware (GPUs = TP x PP per replica).

The shipped table (``prices.csv`` beside this module) holds the GPUs with a price from one public list, Modal's
on-demand prices as a third-party page quoted them on 2026-05-07 (its row says which page). It has no H200 or A40
price: a deployment on them is skipped with that reason until the user gives a table that has one
(``python -m kvstudy.search ... --prices FILE``, the same four columns; a user's table replaces the shipped one).
A second shipped table, ``--prices runpod`` (``prices_runpod.csv``): RunPod's on-demand prices as a third-party page
listed them in March 2026, with H200 (A100 SXM $2.45, H100 SXM $4.76, H200 $6.35, L4 $0.78 per GPU-hour); no A40
price was found in the sources available here, so A40 deployments are skipped under both tables unless a user's
table prices them. Prices change and differ between providers; the point is a ranking by cost under stated prices,
not a quote.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Optional, Union

import pandas as pd

from kvstudy.errors import ConfigError, DataError

SHIPPED = Path(__file__).with_name("prices.csv")
COLUMNS = ("gpu", "usd_per_gpu_hour", "source", "date")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class Price:
    usd_per_gpu_hour: float
    source: str
    date: str


def read_prices(path: Optional[Union[str, Path]] = None) -> Dict[str, Price]:
    """The price table at ``path`` (None: the shipped one), checked: a bad file, column or row is one line naming
    the file, the row (as the file counts, the header being row 1), the column, the value and what is allowed."""
    from kvstudy.profiles.devices import DEVICES

    path = Path(path) if path is not None else SHIPPED
    shipped = SHIPPED.with_name(f"prices_{path.name}.csv")
    if not path.is_file() and path.parent == Path(".") and shipped.is_file():
        path = shipped  # a shipped table by its name (``--prices runpod``)
    if not path.is_file():
        names = ", ".join(sorted(p.stem[len("prices_"):] for p in SHIPPED.parent.glob("prices_*.csv")))
        raise ConfigError(f"--prices={path}: no such file; allowed: a CSV with columns {', '.join(COLUMNS)}, or a "
                          f"shipped table's name ({names})")
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise DataError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]}); allowed: a CSV with columns "
                        f"{', '.join(COLUMNS)}") from None
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise DataError(f"{path}: no column {missing[0]!r}; allowed: a CSV with columns {', '.join(COLUMNS)}")
    prices: Dict[str, Price] = {}
    for k, row in enumerate(table.itertuples(index=False), start=2):
        gpu = row.gpu.strip()
        where = f"{path}: row {k}"
        if gpu not in DEVICES:
            raise DataError(f"{where}, gpu={gpu!r}: unknown GPU; allowed: {', '.join(DEVICES)}")
        if gpu in prices:
            raise DataError(f"{where}, gpu={gpu!r}: a second price for it; allowed: one row per GPU")
        try:
            usd = float(row.usd_per_gpu_hour)
        except ValueError:
            usd = math.nan
        if not (usd > 0 and math.isfinite(usd)):
            raise DataError(f"{where}, usd_per_gpu_hour={row.usd_per_gpu_hour!r}: allowed: US dollars per GPU and "
                            f"hour, a number > 0")
        if not row.source.strip():
            raise DataError(f"{where}, source='': allowed: where the price comes from (a page, a quote)")
        if not DATE.fullmatch(row.date.strip()):
            raise DataError(f"{where}, date={row.date!r}: allowed: the day the price was read, YYYY-MM-DD")
        prices[gpu] = Price(usd, row.source.strip(), row.date.strip())
    if not prices:
        raise DataError(f"{path}: no rows; allowed: one row per GPU with columns {', '.join(COLUMNS)}")
    return prices


def hourly_cost(replicas: Iterable[tuple], prices: Dict[str, Price]) -> float:
    """US dollars per hour of a deployment: ``replicas`` as (device, TP, PP), one per replica. A device without a
    price is a ``ConfigError`` naming it (the search skips such a deployment with that reason)."""
    total = 0.0
    for device, tp, pp in replicas:
        price = prices.get(device)
        if price is None:
            raise ConfigError(f"no price for GPU {device!r} in the price table (it has {', '.join(sorted(prices))}); "
                              f"give a table with one: --prices FILE")
        total += price.usd_per_gpu_hour * tp * pp
    return total
