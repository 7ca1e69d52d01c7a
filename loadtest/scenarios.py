"""The scenarios: what each phase sends, how hard, for how long; and the request bodies.

=============  ================================================================================
name           what it measures
=============  ================================================================================
produce-max    produce throughput: 64 clients in max mode, 100 records of 100 bytes a request
produce-rate   produce-ack latency at a fixed 1,000 requests/s of 10 records
produce-lone   one client, one request at a time (10 records): the latency nobody batches with
consume-hit    consume throughput from the tail cache (the broker that produced the records)
consume-miss   consume throughput from Oxia + S3 (brokers with ``LLOG_TAIL_CACHE_MAX_BYTES=0``)
long-poll      produce ack -> record returned to a consumer waiting in a long poll (a probe,
               not a load generator: one produce at a time)
overload       a rate well above capacity at a broker with a small
               ``LLOG_BATCH_MAX_BUFFER_BYTES``: every refusal should be a 503 with Retry-After
=============  ================================================================================

:data:`SCENARIOS` holds the ``python -m loadtest`` defaults (short: all of them in about three
minutes); :data:`BENCH` the longer ``python -m bench broker`` ones.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

#: Topics, one per scenario that writes (so a phase's records are its own), plus the preloaded
#: topic both consume phases read and the long-poll probe's.
CONSUME_TOPIC = "lt-consume"
POLL_TOPIC = "lt-poll"


@dataclass(frozen=True)
class Scenario:
    name: str
    #: ``produce``, ``consume``, ``long_poll`` or ``overload``.
    kind: str
    duration_s: float = 10.0
    #: Requests per second; 0 is max mode (``workers`` clients back to back).
    rate: int = 0
    workers: int = 64
    max_workers: int | None = None
    #: Records in each produce request, or returned by each consume request.
    records_per_request: int = 100
    record_bytes: int = 100
    partitions: int = 8
    timeout_s: float = 30.0
    #: Seconds of the same load before the measured attack (results dropped).
    warmup_s: float = 1.0
    #: consume: records preloaded into each partition of :data:`CONSUME_TOPIC`.
    preload_records: int = 10_000
    #: consume: read through the tail cache (False: brokers started without one).
    tail_cache: bool = True
    #: long-poll: probes, the consume's max_wait_ms, and how long the consume waits before the
    #: produce is sent.
    probes: int = 200
    max_wait_ms: int = 5000
    park_ms: float = 20.0
    #: overload: the broker's LLOG_BATCH_MAX_BUFFER_BYTES.
    buffer_bytes: int = 256 * 1024

    def replace(self, **changes) -> "Scenario":
        return dataclasses.replace(self, **changes)

    @property
    def topic(self) -> str:
        if self.kind == "consume":
            return CONSUME_TOPIC
        return POLL_TOPIC if self.kind == "long_poll" else f"lt-{self.name}"


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("produce-max", "produce", duration_s=10, rate=0, workers=64, records_per_request=100),
    Scenario("produce-rate", "produce", duration_s=10, rate=1000, workers=32, max_workers=2048,
             records_per_request=10),
    Scenario("produce-lone", "produce", duration_s=5, rate=0, workers=1, records_per_request=10),
    Scenario("consume-hit", "consume", duration_s=8, rate=0, workers=32, records_per_request=500),
    Scenario("consume-miss", "consume", duration_s=8, rate=0, workers=32, records_per_request=500,
             tail_cache=False),
    Scenario("long-poll", "long_poll", probes=200, records_per_request=1, partitions=1),
    Scenario("overload", "overload", duration_s=5, rate=2000, workers=64, max_workers=4096,
             records_per_request=100, timeout_s=10, warmup_s=0),
]}

#: ``python -m bench broker``: the same scenarios, measured for longer.
BENCH: dict[str, Scenario] = {name: SCENARIOS[name].replace(**changes) for name, changes in {
    "produce-max": {"duration_s": 20, "warmup_s": 2},
    "produce-rate": {"duration_s": 20, "warmup_s": 2},
    "produce-lone": {"duration_s": 10},
    "consume-hit": {"duration_s": 15},
    "consume-miss": {"duration_s": 15},
    "long-poll": {"probes": 500},
    "overload": {"duration_s": 8},
}.items()}


def record(partition: int, variant: int, index: int, size: int) -> str:
    """A ``size``-character ASCII record naming where it was made (distinct per body)."""
    head = f"p{partition}v{variant}r{index}-"
    return (head + "x" * size)[:size]


def produce_body(topic: str, partition: int, variant: int, count: int, size: int) -> bytes:
    records = [record(partition, variant, i, size) for i in range(count)]
    return json.dumps({"topic_partitions": [{"topic": topic, "partition": partition, "records": records}]},
                      separators=(",", ":")).encode()


def consume_body(topic: str, partition: int, fetch_offset: int, partition_max_bytes: int,
                 max_wait_ms: int = 0) -> bytes:
    return json.dumps({"topic_partitions": [{"topic": topic, "partition": partition, "fetch_offset": fetch_offset,
                                             "partition_max_bytes": partition_max_bytes}],
                       "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": partition_max_bytes},
                      separators=(",", ":")).encode()
