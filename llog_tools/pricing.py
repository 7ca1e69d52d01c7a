"""S3 list prices, and what a number of bytes costs a month to keep in S3 Standard.

``llog topics describe`` (:mod:`llog_tools.describe`) estimates each topic's monthly storage cost
from the price table ``conf/s3_prices.json`` (``conf/README.md`` describes it): USD per
GB-month per region, tiered by the month's volume (S3 Standard: the first 50 TB at one price,
the next 450 TB at a lower one, the rest lower still), and optionally the request prices.

Where the table is found, first hit wins:

1. ``$LLOG_S3_PRICES_FILE`` when set (only there: a path that was asked for and is missing is
   an error, not a fallback);
2. ``conf/s3_prices.json`` at the root of the checkout this package is in;
3. ``{sys.prefix}/share/llog/s3_prices.json``, where an installed wheel puts it (``setup.py``
   ``data_files``), or ``{site.USER_BASE}/share/llog/s3_prices.json`` (``pip install --user``).

A GB is 2^30 bytes, as AWS bills it (the table's ``bytes_per_gb``). A region the table has no
prices for is priced as its ``default_region`` (us-east-1), and the estimate says so.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import site
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llog.errors import ConfigError

#: The environment variable naming another price table (read here, not through ``Config``:
#: the table is reference data, not a connection setting).
PRICES_FILE_ENV = "LLOG_S3_PRICES_FILE"
#: The table in a checkout: ``<repository>/conf/s3_prices.json``.
CHECKOUT_PRICES_FILE = Path(__file__).resolve().parent.parent / "conf" / "s3_prices.json"
#: The table of an installed wheel (``data_files=[("share/llog", ["conf/s3_prices.json"])]``), in
#: the environment's prefix or, installed with ``--user``, the user's.
INSTALLED_PRICES_FILES = tuple(Path(base) / "share" / "llog" / "s3_prices.json"
                               for base in dict.fromkeys((sys.prefix, site.USER_BASE or sys.prefix)))
#: How many bytes AWS bills as a GB.
GIB = 1 << 30


class PriceTableError(ConfigError):
    """The price table is missing, is not JSON, or does not have the shape ``conf/README.md``
    gives it."""


# --- the table --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StorageTier:
    """Storage up to ``up_to_gb`` GB of the month's volume (None: no upper bound) costs
    ``usd_per_gb_month`` per GB-month."""

    up_to_gb: float | None
    usd_per_gb_month: float


@dataclass(frozen=True)
class RegionPrices:
    region: str
    name: str
    storage_tiers: tuple[StorageTier, ...]
    #: USD per 1,000 requests: ``put`` (PUT, COPY, POST, LIST), ``get`` (GET and the rest); None
    #: when the table does not give them.
    put_usd_per_1000: float | None = None
    get_usd_per_1000: float | None = None

    def monthly_storage_usd(self, gb: float) -> float:
        """What ``gb`` GB kept for a month cost, each tier's share at the tier's price."""
        return tiered_cost(gb, self.storage_tiers)


@dataclass(frozen=True)
class StorageCost:
    """A month of storage for ``bytes`` bytes, at the list prices of ``region``."""

    bytes: int
    gb: float
    usd_per_month: float
    #: The region whose prices were used, and the one asked for (they differ when the table has
    #: no prices for the latter: then the table's default region's were used).
    region: str
    requested_region: str
    as_of: str
    source: str

    @property
    def fell_back(self) -> bool:
        return self.region != self.requested_region

    def basis(self) -> str:
        """Which prices these are, in words (for a description's output)."""
        text = f"S3 Standard list prices of {self.region} as of {self.as_of}"
        if self.fell_back:
            text += f"; no prices for region {self.requested_region!r} in the table, so {self.region}'s"
        return text


@dataclass(frozen=True)
class PriceTable:
    source: str
    as_of: str
    currency: str
    bytes_per_gb: int
    default_region: str
    regions: Mapping[str, RegionPrices]
    #: Where it was read from (None when built in memory).
    path: str | None = None

    def prices_for(self, region: str) -> RegionPrices:
        """``region``'s prices, else the default region's."""
        return self.regions.get(region) or self.regions[self.default_region]

    def monthly_storage_cost(self, nbytes: int, region: str) -> StorageCost:
        """What keeping ``nbytes`` bytes in S3 Standard in ``region`` costs a month, the tiers
        counted from the first (as if these bytes were all the bucket holds)."""
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ValueError(f"a byte count must be an integer >= 0, got {nbytes!r}")
        prices = self.prices_for(region)
        gb = nbytes / self.bytes_per_gb
        return StorageCost(nbytes, gb, prices.monthly_storage_usd(gb), prices.region, region, self.as_of, self.source)


def tiered_cost(gb: float, tiers: tuple[StorageTier, ...] | list[StorageTier]) -> float:
    """USD for ``gb`` GB-months: each tier's slice of ``gb`` at that tier's price."""
    cost, below = 0.0, 0.0
    for tier in tiers:
        top = math.inf if tier.up_to_gb is None else tier.up_to_gb
        if gb <= below:
            break
        cost += (min(gb, top) - below) * tier.usd_per_gb_month
        below = top
    return cost


# --- finding and reading it ---------------------------------------------------------------------------


def prices_file(env: Mapping[str, str] | None = None) -> Path:
    """The price table's path (module doc, in order). When none of them exists, the checkout's
    path, so the error of reading it names where it was expected."""
    env = os.environ if env is None else env
    if env.get(PRICES_FILE_ENV):
        return Path(env[PRICES_FILE_ENV]).expanduser()
    for candidate in (CHECKOUT_PRICES_FILE, *INSTALLED_PRICES_FILES):
        if candidate.is_file():
            return candidate
    return CHECKOUT_PRICES_FILE


def load_prices(path: Path | str | None = None, env: Mapping[str, str] | None = None) -> PriceTable:
    """The price table at ``path`` (default :func:`prices_file`), checked. Raises
    :class:`PriceTableError` naming the file and what is wrong with it."""
    env = os.environ if env is None else env
    named_by = ""
    if path is None:
        path = prices_file(env)
        named_by = f" (named by {PRICES_FILE_ENV})" if env.get(PRICES_FILE_ENV) else ""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PriceTableError(f"S3 price table {path}{named_by} not found; it ships as conf/s3_prices.json in "
                              f"the repository, or set {PRICES_FILE_ENV} to a copy") from None
    except OSError as e:
        raise PriceTableError(f"S3 price table {path} cannot be read: {e}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise PriceTableError(f"S3 price table {path} is not JSON: {e}") from None
    return parse_prices(raw, str(path))


def parse_prices(raw: Any, where: str = "S3 price table") -> PriceTable:
    """A price table from its JSON form; :class:`PriceTableError` names the first problem."""
    if not isinstance(raw, dict):
        raise PriceTableError(f"{where}: must be a JSON object, got {type(raw).__name__}")
    source = _text(raw, "source", where)
    as_of = _text(raw, "as_of", where)
    try:
        datetime.date.fromisoformat(as_of)
    except ValueError:
        raise PriceTableError(f"{where}: as_of must be a date YYYY-MM-DD (when the prices were taken), "
                              f"got {as_of!r}") from None
    currency = _text(raw, "currency", where)
    if currency != "USD":
        raise PriceTableError(f"{where}: currency must be 'USD', got {currency!r}")
    bytes_per_gb = raw.get("bytes_per_gb")
    if not _is_int(bytes_per_gb) or bytes_per_gb < 1:
        raise PriceTableError(f"{where}: bytes_per_gb must be a positive integer (AWS bills a GB as 2^30 = "
                              f"{GIB} bytes), got {bytes_per_gb!r}")
    regions = raw.get("regions")
    if not isinstance(regions, dict) or not regions:
        raise PriceTableError(f"{where}: regions must be a non-empty object of region name to its prices")
    parsed = {name: _region(name, value, f"{where}: regions.{name}") for name, value in regions.items()}
    default = _text(raw, "default_region", where)
    if default not in parsed:
        raise PriceTableError(f"{where}: default_region {default!r} has no prices in regions "
                              f"(it has {', '.join(sorted(parsed))})")
    return PriceTable(source, as_of, currency, bytes_per_gb, default, parsed, where)


def _region(region: str, raw: Any, where: str) -> RegionPrices:
    if not isinstance(raw, dict):
        raise PriceTableError(f"{where}: must be an object, got {raw!r}")
    name = raw.get("name", region)
    if not isinstance(name, str):
        raise PriceTableError(f"{where}.name must be a string, got {name!r}")
    tiers = raw.get("storage_tiers")
    if not isinstance(tiers, list) or not tiers:
        raise PriceTableError(f"{where}.storage_tiers must be a non-empty list of "
                              f"{{\"up_to_gb\": number or null, \"usd_per_gb_month\": number}}")
    parsed = tuple(_tier(t, f"{where}.storage_tiers[{i}]") for i, t in enumerate(tiers))
    bounds = [t.up_to_gb for t in parsed[:-1]]
    if None in bounds or parsed[-1].up_to_gb is not None:
        raise PriceTableError(f"{where}.storage_tiers: only the last tier may be, and it must be, open-ended "
                              f"(up_to_gb null)")
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise PriceTableError(f"{where}.storage_tiers: up_to_gb must increase from tier to tier, got {bounds}")
    requests = raw.get("requests_usd_per_1000", {})
    if not isinstance(requests, dict):
        raise PriceTableError(f"{where}.requests_usd_per_1000 must be an object {{\"put\": USD, \"get\": USD}}")
    put, get = (_price(requests, kind, f"{where}.requests_usd_per_1000", optional=True) for kind in ("put", "get"))
    return RegionPrices(region, name, parsed, put, get)


def _tier(raw: Any, where: str) -> StorageTier:
    if not isinstance(raw, dict):
        raise PriceTableError(f"{where}: must be an object, got {raw!r}")
    up_to = raw.get("up_to_gb")
    if up_to is not None and (not _is_number(up_to) or up_to <= 0):
        raise PriceTableError(f"{where}.up_to_gb must be a number > 0, or null for the last tier, got {up_to!r}")
    return StorageTier(up_to, _price(raw, "usd_per_gb_month", where))


def _price(raw: dict, name: str, where: str, optional: bool = False) -> float | None:
    value = raw.get(name)
    if value is None and optional:
        return None
    if not _is_number(value) or value < 0 or not math.isfinite(value):
        raise PriceTableError(f"{where}.{name} must be a number >= 0 (USD), got {value!r}")
    return float(value)


def _text(raw: dict, name: str, where: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str) or not value.strip():
        raise PriceTableError(f"{where}: {name} must be a non-empty string, got {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
