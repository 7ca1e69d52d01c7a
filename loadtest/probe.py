"""The long-poll probe: end-to-end latency from a produce's ack to the record reaching a
consumer already waiting for it. A latency probe, not a load generator: one record at a time.

Each probe: a consume of ``fetch_offset`` = the partition's last offset + 1 with ``max_wait_ms``
is sent (its own connection), ``park_ms`` later one record is produced (another connection), and
each side notes when its answer arrived. ``e2e`` is consume answer minus produce ack (the broker
may answer the consumer first: then it is negative, counted in ``answered_before_ack`` and
taken as 0 in the percentiles); ``produce_to_answer`` is consume answer minus produce start.
Every probe is a line of ``probes.jsonl``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

#: Unmeasured probes first (connections, the partition's first append).
WARMUP_PROBES = 5


async def _post(client: httpx.AsyncClient, path: str, body: dict) -> tuple[httpx.Response, float]:
    response = await client.post(path, json=body)
    return response, time.perf_counter()


async def _probe(producer, consumer, topic: str, partition: int, last: int, value: str, max_wait_ms: int,
                 park_ms: float) -> dict:
    consume = asyncio.create_task(_post(consumer, "/consume", {
        "topic_partitions": [{"topic": topic, "partition": partition, "fetch_offset": last + 1}],
        "max_wait_ms": max_wait_ms, "min_bytes": 1}))
    await asyncio.sleep(park_ms / 1000)
    started = time.perf_counter()
    produced, acked = await _post(producer, "/produce",
                                  {"topic_partitions": [{"topic": topic, "partition": partition, "records": [value]}]})
    answer, answered = await consume
    out = {"produce_status": produced.status_code, "consume_status": answer.status_code,
           "e2e_ms": round((answered - acked) * 1000, 3), "produce_to_answer_ms": round((answered - started) * 1000, 3),
           "ack_ms": round((acked - started) * 1000, 3)}
    if produced.status_code == 200:
        out["offset"] = produced.json()["results"][0]["end_offset"]
    if answer.status_code == 200:
        records = (answer.json()["results"][0].get("records") or [])
        out["delivered"] = any(r.get("offset") == last + 1 and r.get("payload") == value for r in records)
    else:
        out["delivered"], out["consume_error"] = False, answer.text[:300]
    return out


async def _run(url: str, topic: str, partition: int, probes: int, max_wait_ms: int, park_ms: float,
               out: Path) -> list[dict]:
    timeout = httpx.Timeout(max_wait_ms / 1000 + 30)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as producer, \
            httpx.AsyncClient(base_url=url, timeout=timeout) as consumer:
        first = await producer.post("/produce", json={
            "topic_partitions": [{"topic": topic, "partition": partition, "records": ["probe-start"]}]})
        first.raise_for_status()
        last = first.json()["results"][0]["end_offset"]
        results = []
        with open(out, "w") as lines:
            for i in range(WARMUP_PROBES + probes):
                result = await _probe(producer, consumer, topic, partition, last, f"probe-{i}", max_wait_ms, park_ms)
                result["probe"], result["warmup"] = i, i < WARMUP_PROBES
                lines.write(json.dumps(result) + "\n")
                if "offset" not in result:  # the produce failed: where the partition ends is unknown
                    raise RuntimeError(f"long-poll probe {i}: produce answered {result['produce_status']}")
                last = result["offset"]
                if not result["warmup"]:
                    results.append(result)
        return results


def run(url: str, topic: str, partition: int, probes: int, max_wait_ms: int, park_ms: float, out: Path) -> dict:
    """Run the probes against the broker at ``url``; their summary."""
    results = asyncio.run(_run(url, topic, partition, probes, max_wait_ms, park_ms, out))
    delivered = [r for r in results if r["delivered"]]
    e2e = [max(r["e2e_ms"], 0.0) for r in delivered]
    whole = [r["produce_to_answer_ms"] for r in delivered]

    def pct(values, q):
        return round(float(np.percentile(values, q, method="higher")), 3) if values else None

    consumes = Counter(str(r["consume_status"]) for r in results)
    produces = Counter(str(r["produce_status"]) for r in results)
    errors = Counter(r["consume_error"] for r in results if "consume_error" in r)
    return {
        "probes": len(results), "delivered": len(delivered), "not_delivered": len(results) - len(delivered),
        "consume_status_counts": dict(consumes), "produce_status_counts": dict(produces),
        "non_200": sum(n for c, n in (consumes + produces).items() if c != "200"),
        "consume_errors": dict(errors.most_common(3)),
        "answered_before_ack": sum(r["e2e_ms"] < 0 for r in delivered),
        "e2e_p50_ms": pct(e2e, 50), "e2e_p99_ms": pct(e2e, 99), "e2e_max_ms": pct(e2e, 100),
        "produce_to_answer_p50_ms": pct(whole, 50), "produce_to_answer_p99_ms": pct(whole, 99),
        "ack_p50_ms": pct([r["ack_ms"] for r in results], 50),
        "max_wait_ms": max_wait_ms, "park_ms": park_ms,
    }
