"""llog_tools.observe without processes: the brokers found in a stack's state record, the config."""

from __future__ import annotations

import pytest

from llog.errors import LlogError
from llog_tools.observe import Paths, broker_targets, prometheus_config


def test_brokers_of_both_record_shapes_without_repeats():
    record = {"broker": {"pid": 1, "port": 8080},
              "brokers": [{"pid": 2, "port": 8081, "url": "http://127.0.0.1:8081"}, {"pid": 3, "port": 8080}]}
    assert broker_targets(record) == ["127.0.0.1:8081", "127.0.0.1:8080"]
    assert broker_targets({"broker": {"pid": 1, "port": 8080}}) == ["127.0.0.1:8080"]
    assert broker_targets({}) == []


def test_the_balancer_in_front_of_the_brokers_is_not_scraped():
    # As `llog stack up --brokers 2` records them: scraped through HAProxy, one broker's figures
    # would come back again under the balancer's address.
    record = {"broker": {"pid": 1, "port": 8080, "url": "http://127.0.0.1:8080", "balancer": {"kind": "haproxy"}},
              "brokers": [{"name": "broker-0", "pid": 2, "port": 8081, "url": "http://127.0.0.1:8081"},
                          {"name": "broker-1", "pid": 3, "port": 8082, "url": "http://127.0.0.1:8082"}]}
    assert broker_targets(record) == ["127.0.0.1:8081", "127.0.0.1:8082"]


def test_a_broker_without_an_address_is_named():
    with pytest.raises(LlogError, match="neither url nor port"):
        broker_targets({"brokers": [{"pid": 4}]})


def test_config_scrapes_the_brokers_metrics_path_and_the_exporter(tmp_path):
    config = prometheus_config(Paths(tmp_path), 9100, 1.5)
    jobs = {c["job_name"]: c for c in config["scrape_configs"]}
    assert jobs["llog_broker"]["metrics_path"] == "/metrics/prometheus"
    assert jobs["llog_broker"]["file_sd_configs"][0]["files"] == [str(tmp_path / "observe" / "brokers.json")]
    assert jobs["llog_jobs"]["static_configs"][0]["targets"] == ["127.0.0.1:9100"]
    assert config["global"]["scrape_interval"] == "1.5s"
