"""The S3 price table (conf/s3_prices.json) and the monthly cost of a byte count: tiers, the
fallback region, and clear errors for a missing or malformed table. No servers."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from llog_tools.pricing import (
    CHECKOUT_PRICES_FILE, GIB, PRICES_FILE_ENV, PriceTableError, StorageTier, load_prices, parse_prices, prices_file,
    tiered_cost,
)

REPO = Path(__file__).resolve().parents[2]
TB = 1024 * GIB  # AWS's TB: 1024 GB of 2^30 bytes


@pytest.fixture(scope="module")
def table():
    return load_prices(REPO / "conf" / "s3_prices.json")


@pytest.fixture(scope="module")
def raw():
    return json.loads((REPO / "conf" / "s3_prices.json").read_text())


def test_the_shipped_table_is_found_in_the_checkout_and_has_the_regions(table):
    assert CHECKOUT_PRICES_FILE == REPO / "conf" / "s3_prices.json"
    assert prices_file(env={}) == CHECKOUT_PRICES_FILE
    assert load_prices(env={}).regions.keys() == table.regions.keys()
    assert set(table.regions) >= {"us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1", "ap-southeast-1"}
    assert (table.currency, table.bytes_per_gb, table.default_region) == ("USD", 2**30, "us-east-1")
    assert table.as_of and table.source.startswith("https://aws.amazon.com/s3/pricing")
    us = table.regions["us-east-1"]
    assert [(t.up_to_gb, t.usd_per_gb_month) for t in us.storage_tiers] == [
        (51200, 0.023), (512000, 0.022), (None, 0.021)]
    assert (us.put_usd_per_1000, us.get_usd_per_1000) == (0.005, 0.0004)


def test_the_conf_directory_is_not_ignored_by_git():
    ignore = (REPO / ".gitignore").read_text().splitlines()
    assert not any(line.strip().strip("/").startswith("conf") for line in ignore)


def test_a_gb_is_two_to_the_thirtieth_bytes(table):
    cost = table.monthly_storage_cost(10 * GIB, "us-east-1")
    assert cost.gb == 10.0
    assert cost.usd_per_month == pytest.approx(0.23)
    assert table.monthly_storage_cost(10 * 10**9, "us-east-1").usd_per_month == pytest.approx(10e9 / 2**30 * 0.023)
    assert table.monthly_storage_cost(0, "us-east-1").usd_per_month == 0


def test_tiers_price_each_slice_of_the_volume_at_its_own_price(table):
    first = 50 * 1024 * 0.023
    assert table.monthly_storage_cost(50 * TB, "us-east-1").usd_per_month == pytest.approx(first)
    assert table.monthly_storage_cost(51 * TB, "us-east-1").usd_per_month == pytest.approx(first + 1024 * 0.022)
    second = 450 * 1024 * 0.022
    assert table.monthly_storage_cost(500 * TB, "us-east-1").usd_per_month == pytest.approx(first + second)
    assert table.monthly_storage_cost(600 * TB, "us-east-1").usd_per_month == pytest.approx(
        first + second + 100 * 1024 * 0.021)
    frankfurt = table.monthly_storage_cost(600 * TB, "eu-central-1")
    assert frankfurt.usd_per_month == pytest.approx(50 * 1024 * 0.0245 + 450 * 1024 * 0.0235 + 100 * 1024 * 0.0225)
    assert (frankfurt.region, frankfurt.fell_back) == ("eu-central-1", False)


def test_tiered_cost_of_fractions_and_of_a_single_open_tier():
    tiers = [StorageTier(1, 10.0), StorageTier(3, 1.0), StorageTier(None, 0.5)]
    assert tiered_cost(0.5, tiers) == pytest.approx(5.0)
    assert tiered_cost(2.5, tiers) == pytest.approx(10.0 + 1.5)
    assert tiered_cost(7, tiers) == pytest.approx(10.0 + 2.0 + 2.0)
    assert tiered_cost(123.0, [StorageTier(None, 0.02)]) == pytest.approx(2.46)


def test_an_unknown_region_falls_back_to_us_east_1_and_says_so(table):
    cost = table.monthly_storage_cost(GIB, "mars-north-1")
    assert (cost.region, cost.requested_region, cost.fell_back) == ("us-east-1", "mars-north-1", True)
    assert cost.usd_per_month == pytest.approx(0.023)
    assert "us-east-1" in cost.basis() and "'mars-north-1'" in cost.basis() and table.as_of in cost.basis()
    known = table.monthly_storage_cost(GIB, "ap-southeast-1")
    assert not known.fell_back and known.basis() == f"S3 Standard list prices of ap-southeast-1 as of {table.as_of}"


def test_a_negative_byte_count_is_refused(table):
    with pytest.raises(ValueError, match="byte count must be an integer >= 0, got -1"):
        table.monthly_storage_cost(-1, "us-east-1")


def test_the_environment_variable_names_another_table(tmp_path, raw):
    other = copy.deepcopy(raw)
    other["regions"]["us-east-1"]["storage_tiers"] = [{"up_to_gb": None, "usd_per_gb_month": 1.0}]
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(other))
    env = {PRICES_FILE_ENV: str(path)}
    assert prices_file(env) == path
    assert load_prices(env=env).monthly_storage_cost(3 * GIB, "us-east-1").usd_per_month == 3.0
    missing = {PRICES_FILE_ENV: str(tmp_path / "absent.json")}
    with pytest.raises(PriceTableError, match=rf"absent.json \(named by {PRICES_FILE_ENV}\) not found"):
        load_prices(env=missing)


def test_a_file_that_is_not_json_names_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"regions": ')
    with pytest.raises(PriceTableError, match=r"broken.json is not JSON"):
        load_prices(path)


def _broken(raw, change):
    broken = copy.deepcopy(raw)
    change(broken)
    return broken


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("as_of"), r"as_of must be a non-empty string, got None"),
    (lambda t: t.update(as_of="last spring"), r"as_of must be a date YYYY-MM-DD"),
    (lambda t: t.update(currency="EUR"), r"currency must be 'USD', got 'EUR'"),
    (lambda t: t.update(bytes_per_gb=1e9), r"bytes_per_gb must be a positive integer"),
    (lambda t: t.update(regions={}), r"regions must be a non-empty object"),
    (lambda t: t.update(default_region="eu-north-1"), r"default_region 'eu-north-1' has no prices in regions"),
    (lambda t: t["regions"]["us-west-2"].pop("storage_tiers"),
     r"regions.us-west-2.storage_tiers must be a non-empty list"),
    (lambda t: t["regions"]["eu-west-1"]["storage_tiers"][1].update(usd_per_gb_month="0.022"),
     r"regions.eu-west-1.storage_tiers\[1\].usd_per_gb_month must be a number >= 0 \(USD\), got '0.022'"),
    (lambda t: t["regions"]["eu-west-1"]["storage_tiers"][0].update(usd_per_gb_month=-0.01),
     r"storage_tiers\[0\].usd_per_gb_month must be a number >= 0"),
    (lambda t: t["regions"]["us-east-2"]["storage_tiers"][0].update(up_to_gb=0),
     r"regions.us-east-2.storage_tiers\[0\].up_to_gb must be a number > 0, or null"),
    (lambda t: t["regions"]["us-east-2"]["storage_tiers"][1].update(up_to_gb=100),
     r"regions.us-east-2.storage_tiers: up_to_gb must increase from tier to tier, got \[51200, 100\]"),
    (lambda t: t["regions"]["us-east-2"]["storage_tiers"][2].update(up_to_gb=10**7),
     r"only the last tier may be, and it must be, open-ended"),
    (lambda t: t["regions"]["us-east-2"]["storage_tiers"][1].update(up_to_gb=None),
     r"only the last tier may be, and it must be, open-ended"),
    (lambda t: t["regions"]["ap-southeast-1"].update(requests_usd_per_1000={"put": "cheap"}),
     r"regions.ap-southeast-1.requests_usd_per_1000.put must be a number >= 0"),
])
def test_a_malformed_table_is_refused_naming_the_problem(raw, change, message):
    with pytest.raises(PriceTableError, match=message):
        parse_prices(_broken(raw, change), "prices.json")


def test_a_table_that_is_not_an_object_is_refused():
    with pytest.raises(PriceTableError, match=r"prices.json: must be a JSON object, got list"):
        parse_prices([], "prices.json")


def test_request_prices_are_optional(raw):
    lean = _broken(raw, lambda t: t["regions"]["us-east-1"].pop("requests_usd_per_1000"))
    us = parse_prices(lean).regions["us-east-1"]
    assert (us.put_usd_per_1000, us.get_usd_per_1000) == (None, None)
