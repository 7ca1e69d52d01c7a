"""One load-test run: brokers on a stack, the scenarios' phases one after another, and the run
directory with everything they produced.

Run directory (``loadtest/results/<UTC timestamp>-<label>/``):

- ``scenario.json``: the resolved scenarios, brokers, vegeta version, the machine;
- ``targets/<phase>.json``: vegeta's targets (JSON format, bodies base64);
- ``<phase>/results.bin`` (vegeta's gob results), ``report.json``, ``hist.txt``, ``hdrplot.txt``,
  ``phase.json`` (the phase's summary plus every ``/metrics`` counter that moved; ``cpu_cores``:
  the cores each process kept busy over the attack, brokers, balancer, Oxia, S3 and vegeta;
  behind a balancer, ``balancer_requests_per_broker`` and ``balancer_response_ms_per_broker``
  from HAProxy's statistics);
  ``long-poll/probes.jsonl`` instead for the probe;
- ``metrics.jsonl``: each broker's ``GET /metrics`` every second, labelled with the phase;
- ``broker-<name>.log``: each broker's output;
- ``summary.json``: the summary (also the last line :func:`main` prints).

Counts reconcile: a produce phase reads each partition's high watermark before and after its
attack, so ``log_records`` (what the log gained) can be checked against ``records`` (acked
requests x records per request); they are equal unless a request timed out (its records may
or may not have been written). S3 PUTs are counted two ways: distinct ``wal_uri`` in the acks
(one blob, one PUT) and the brokers' ``/metrics`` counter, which must be at least the first. A
consume phase's records (the bodies' ``record_count``) must equal the brokers' counter. A
counter some broker does not report fails the reconciliation: what cannot be checked is not
taken as checked. ``unreconciled`` lists, per phase, what did not reconcile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import platform
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import httpx

from llog.config import Config
from llog.coordination import Coordination
from llog.errors import PartitionNotInitialized
from llog.reader import LogReader
from llog.topics import create_topic
from loadtest import probe, vegeta
from llog_tools.stack.haproxy import PARTITION_HEADER
from loadtest.brokers import COUNTERS, Balancer, Broker, MetricsSampler, counter_delta, cpu_seconds
from loadtest.scenarios import Scenario, consume_body, produce_body

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: S3 Standard request prices (us-east-1), USD per request.
S3_PUT_USD = 0.005 / 1000
S3_GET_USD = 0.0004 / 1000
#: Distinct bodies per partition in a produce phase's targets.
VARIANTS = 2
#: Records in each preload request of the consume phases.
PRELOAD_BATCH = 1000
_RECORD_COUNT = re.compile(rb'"record_count":(\d+)')
_WAL_URI = re.compile(rb'"wal_uri":"([^"]+)"')


def make_run_dir(results_dir: Path | None, label: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = Path(results_dir or RESULTS_DIR) / f"{stamp}-{label}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def progress(message: str) -> None:
    print(f"loadtest: {message}", file=sys.stderr, flush=True)


@dataclass
class Run:
    dir: Path
    config: Config
    vegeta: Path
    brokers: list[Broker] = field(default_factory=list)
    sampler: MetricsSampler | None = None
    preloaded: dict[int, int] | None = None
    #: Brokers behind HAProxy (:class:`Balancer`, one per set of brokers), not addressed by hand.
    balanced: bool = False
    #: With ``balanced``: send the route key (``X-Llog-Partition: topic/partition``); without it
    #: the balancer spreads requests round robin (the comparison without affinity).
    route: bool = True
    #: Per set of brokers (the first broker's name), its balancer.
    balancers: dict[str, Balancer] = field(default_factory=dict)
    #: Other processes whose CPU a phase reports (the stack's Oxia and S3 server): name to pid.
    processes: dict[str, int] = field(default_factory=dict)

    def broker_for(self, partition: int, brokers: list[Broker] | None = None) -> Broker:
        brokers = brokers or self.brokers
        return brokers[partition % len(brokers)]

    def balancer(self, brokers: list[Broker]) -> Balancer:
        """The balancer in front of ``brokers``, started on first use."""
        key = brokers[0].name
        if key not in self.balancers:
            self.balancers[key] = Balancer(f"balancer-{key}", brokers, self.dir).start()
        return self.balancers[key]

    def endpoint(self, path: str, topic: str, partition: int,
                 brokers: list[Broker] | None = None) -> tuple[str, tuple[tuple[str, str], ...]]:
        """Where a request for ``topic``/``partition`` goes: its URL and headers. By hand, to broker
        ``partition % N``; balanced, to the balancer with the route key (unless ``route`` is off)."""
        brokers = brokers or self.brokers
        if not self.balanced:
            return f"{self.broker_for(partition, brokers).url}{path}", ()
        headers = ((PARTITION_HEADER, f"{topic}/{partition}"),) if self.route else ()
        return f"{self.balancer(brokers).url}{path}", headers

    def _cpu(self, brokers: list[Broker]) -> dict[str, float | None]:
        pids = {f"broker-{b.name}": b.proc.pid if b.proc else None for b in brokers}
        if self.balanced:
            pids["balancer"] = self.balancer(brokers).proc.pid
        return {name: cpu_seconds(pid) for name, pid in {**pids, **self.processes}.items()}

    def start_broker(self, name: str, **settings) -> Broker:
        return Broker(name, self.config, self.dir, {k: str(v) for k, v in settings.items()}).start()

    # --- phases -------------------------------------------------------------------------------

    def phase(self, scenario: Scenario) -> dict:
        progress(f"{scenario.name}: {scenario.kind}, {scenario.duration_s:g} s" if scenario.kind != "long_poll"
                 else f"{scenario.name}: {scenario.probes} probes")
        out = self.dir / scenario.name
        out.mkdir()
        if scenario.kind == "produce":
            return self._produce(scenario, out, self.brokers)
        if scenario.kind == "overload":
            broker = self.start_broker("overload", LLOG_BATCH_MAX_BUFFER_BYTES=scenario.buffer_bytes)
            try:
                result = self._produce(scenario, out, [broker])
            finally:
                if broker.name in self.balancers:
                    self.balancers.pop(broker.name).stop()
                exit_status = broker.stop()
            result["broker_exit_status"] = exit_status
            result["overload_non_503_errors"] = result["requests"] - result["ok_requests"] - result["retry_after_503"]
            return result
        if scenario.kind == "consume":
            self._preload(scenario)
            if scenario.tail_cache:
                return self._consume(scenario, out, self.brokers)
            brokers = [self.start_broker(f"miss-{i}", LLOG_TAIL_CACHE_MAX_BYTES=0) for i in range(len(self.brokers))]
            try:
                return self._consume(scenario, out, brokers)
            finally:
                if brokers[0].name in self.balancers:
                    self.balancers.pop(brokers[0].name).stop()
                for broker in brokers:
                    broker.stop()
        if scenario.kind == "long_poll":
            broker = self.brokers[0]
            self.sampler.watch(scenario.name, [broker])
            before = [broker.metrics()]
            result = probe.run(broker.url, scenario.topic, 0, scenario.probes, scenario.max_wait_ms,
                               scenario.park_ms, out / "probes.jsonl")
            _write_metrics_delta(out, before, [broker.metrics()])
            return result
        raise ValueError(f"unknown scenario kind {scenario.kind!r}")

    def _attack(self, scenario: Scenario, out: Path, targets: list[vegeta.Target], brokers: list[Broker],
                max_body: int, on_body, mark=None) -> tuple[vegeta.AttackStats, list, list, dict]:
        """Warm up, then the measured attack with ``/metrics`` read before and after it (and
        ``mark()``, when given, whose increase over the attack is returned as ``marked``)."""
        path = vegeta.write_targets(self.dir / "targets" / f"{scenario.name}.json", targets)
        spec = vegeta.Attack(duration_s=scenario.duration_s, rate=scenario.rate, workers=scenario.workers,
                             max_workers=scenario.max_workers, timeout_s=scenario.timeout_s, max_body=max_body)
        self.sampler.watch(scenario.name, brokers)
        if scenario.warmup_s > 0:
            warm = out / "warmup.bin"
            vegeta.attack(self.vegeta, path, warm, dataclasses.replace(spec, duration_s=scenario.warmup_s),
                          name=f"{scenario.name}-warmup")
            warm.unlink()
        before = [b.metrics() for b in brokers]
        marked = mark() if mark else None
        routed = self.balancer(brokers).server_requests() if self.balanced else None
        cpu, children, started = self._cpu(brokers), os.times(), time.monotonic()
        command = vegeta.attack(self.vegeta, path, out / "results.bin", spec, name=scenario.name)
        cpu_after, children_after, elapsed = self._cpu(brokers), os.times(), time.monotonic() - started
        response_ms = None
        if routed is not None:
            routed = {k: v - routed.get(k, 0) for k, v in self.balancer(brokers).server_requests().items()}
            response_ms = self.balancer(brokers).server_response_ms()
        if mark:
            marked = mark() - marked
        after = [b.metrics() for b in brokers]
        # Cores each process kept busy over the attack; vegeta's own from this process's children.
        cores = {name: round((cpu_after[name] - t) / elapsed, 2) for name, t in cpu.items()
                 if t is not None and cpu_after.get(name) is not None}
        cores["vegeta"] = round((children_after.children_user + children_after.children_system
                                 - children.children_user - children.children_system) / elapsed, 2)
        stats = vegeta.analyse(self.vegeta, out / "results.bin", out, on_body)
        report = json.loads((out / "report.json").read_text())
        return stats, before, after, {
            # what vegeta sent per second while attacking, and answered 2xx per second overall
            "sent_per_s": round(report["rate"], 1), "vegeta_throughput_per_s": round(report["throughput"], 1),
            "command": " ".join(command), "targets": len(targets), "marked": marked, "cpu_cores": cores,
            "cpu_cores_total": round(sum(cores.values()), 2), "load_average": list(os.getloadavg()),
            **({"balancer_requests_per_broker": routed, "balancer_response_ms_per_broker": response_ms}
               if routed is not None else {})}

    def _create_topic(self, scenario: Scenario) -> None:
        """The scenario's topic with its partitions (a produce to a partition past a topic's count
        is refused; docs/protocol.md section 10), if it does not exist yet."""
        with Coordination(self.config) as coordination:
            create_topic(coordination, self.config.root_prefix, scenario.topic, scenario.partitions, if_not_exists=True)

    def _produce(self, scenario: Scenario, out: Path, brokers: list[Broker]) -> dict:
        self._create_topic(scenario)
        topic, n = scenario.topic, scenario.records_per_request
        targets = []
        for v in range(VARIANTS):
            for p in range(scenario.partitions):
                url, headers = self.endpoint("/produce", topic, p, brokers)
                targets.append(vegeta.Target(url, produce_body(topic, p, v, n, scenario.record_bytes), headers=headers))
        wal_uris: set[bytes] = set()

        def on_body(code: int, body: bytes) -> None:
            if code == 200:
                wal_uris.update(_WAL_URI.findall(body))

        with LogReader(self.config) as reader:
            def log_records() -> int:
                return sum(_high_watermark(reader, topic, p) for p in range(scenario.partitions))

            stats, before, after, attack = self._attack(scenario, out, targets, brokers, -1, on_body, log_records)
        records, log_records = stats.ok * n, attack.pop("marked")
        puts_acks = len(wal_uris)
        puts_metrics = counter_delta(before, after, "s3_put")
        gets_metrics = counter_delta(before, after, "s3_get")
        problems = reconcile_produce(records, log_records, stats.transport_errors, puts_acks, puts_metrics)
        result = {**stats.summary(), "records_per_request": n, "records": records,
                  "records_per_s": round(records / stats.span_s) if stats.ok else 0,
                  "mb_per_s": round(records * scenario.record_bytes / stats.span_s / 1e6, 2) if stats.ok else 0.0,
                  "log_records": log_records, **_reconciliation(problems),
                  **attack}
        puts = puts_metrics if puts_metrics is not None else puts_acks
        result.update({
            "s3_puts_from_acks": puts_acks, "s3_puts_from_metrics": puts_metrics,
            "s3_puts_per_s": round(puts / stats.span_s, 1) if stats.requests else None,
            "ok_requests_per_s3_put": round(stats.ok / puts, 1) if puts else None,
            "s3_gets_from_metrics": gets_metrics,
            "s3_cost_usd_per_million_records": _cost_per_million(puts, gets_metrics or 0, records),
            **_metrics_cost(before, after, records),
        })
        _write_metrics_delta(out, before, after)
        return result

    def _preload(self, scenario: Scenario) -> None:
        """Write ``preload_records`` records into each partition of the consume topic, once,
        through the brokers under test (partition ``p`` through :meth:`broker_for`), so the
        offsets 1..N of every partition exist (and sit in the producing broker's tail cache)."""
        if self.preloaded is not None:
            return
        self._create_topic(scenario)
        started = time.monotonic()
        self.preloaded = asyncio.run(_preload(self, scenario))
        progress(f"preloaded {sum(self.preloaded.values())} records into {scenario.topic} "
                 f"in {time.monotonic() - started:.1f} s")

    def _consume(self, scenario: Scenario, out: Path, brokers: list[Broker]) -> dict:
        n, size = scenario.records_per_request, scenario.record_bytes
        targets = []
        for k in range(max(1, min(self.preloaded.values()) // n)):
            for p in range(scenario.partitions):
                url, headers = self.endpoint("/consume", scenario.topic, p, brokers)
                targets.append(vegeta.Target(url, consume_body(scenario.topic, p, 1 + k * n, n * size),
                                             headers=headers))
        counted = {"records": 0, "bodies": 0, "unparsed": 0}

        def on_body(code: int, body: bytes) -> None:
            if code == 200:
                found = _RECORD_COUNT.findall(body)
                counted["bodies"] += 1
                if found:
                    counted["records"] += sum(int(x) for x in found)
                else:
                    counted["unparsed"] += 1

        # A prefix of each body is enough: record_count comes before the records.
        stats, before, after, attack = self._attack(scenario, out, targets, brokers, 1024, on_body)
        attack.pop("marked")
        records = counted["records"]
        from_metrics = counter_delta(before, after, "consume_records")
        gets = counter_delta(before, after, "s3_get")
        result = {**stats.summary(), "records_per_request": n, "records": records,
                  "records_per_s": round(records / stats.span_s) if stats.ok else 0,
                  "mb_per_s": round(records * size / stats.span_s / 1e6, 2) if stats.ok else 0.0,
                  "records_from_metrics": from_metrics, "bodies_without_record_count": counted["unparsed"],
                  **_reconciliation(reconcile_consume(records, from_metrics)),
                  "tail_cache_hits": counter_delta(before, after, "tail_cache_hits"),
                  "tail_cache_misses": counter_delta(before, after, "tail_cache_misses"),
                  "s3_gets_from_metrics": gets,
                  "s3_gets_per_s": round(gets / stats.span_s, 1) if gets is not None and stats.ok else None,
                  "s3_cost_usd_per_million_records": _cost_per_million(0, gets, records) if gets is not None else None,
                  **_metrics_cost(before, after, records),
                  "long_poll_hits": counter_delta(before, after, "long_poll_hits"),
                  **attack}
        _write_metrics_delta(out, before, after)
        return result


async def _preload(run: Run, scenario: Scenario) -> dict[int, int]:
    """Each partition's last offset after the preload (sequential per partition, the partitions
    at once)."""
    limits = httpx.Limits(max_connections=scenario.partitions)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def fill(p: int) -> int:
            (url, headers), last, done = run.endpoint("/produce", scenario.topic, p), 0, 0
            while done < scenario.preload_records:
                count = min(PRELOAD_BATCH, scenario.preload_records - done)
                body = produce_body(scenario.topic, p, 0, count, scenario.record_bytes)
                for _ in range(60):
                    response = await client.post(url, content=body,
                                                 headers={"content-type": "application/json", **dict(headers)})
                    if response.status_code != 503:
                        break
                    await asyncio.sleep(float(response.headers.get("retry-after", 1)))
                response.raise_for_status()
                last = response.json()["results"][0]["end_offset"]
                done += count
            return last

        lasts = await asyncio.gather(*(fill(p) for p in range(scenario.partitions)))
    return dict(enumerate(lasts))


def reconcile_produce(records: int, log_records: int, transport_errors: int, puts_from_acks: int,
                      puts_from_metrics: float | None) -> list[str]:
    """What did not reconcile in a produce phase (module doc); empty when everything did."""
    problems = []
    if log_records != records and not (transport_errors and log_records >= records):
        at_least = f" at least (with {transport_errors} request(s) timed out)" if transport_errors else ""
        problems.append(f"the log gained {log_records} records, the acks say{at_least} {records}")
    if puts_from_metrics is None:
        problems.append(f"a broker's /metrics has no {COUNTERS['s3_put']}: S3 PUTs not checked")
    elif puts_from_metrics < puts_from_acks:
        problems.append(f"the brokers counted {puts_from_metrics:g} S3 PUTs, the acks name {puts_from_acks} blobs")
    return problems


def reconcile_consume(records: int, records_from_metrics: float | None) -> list[str]:
    """What did not reconcile in a consume phase (module doc); empty when everything did."""
    if records_from_metrics is None:
        return [f"a broker's /metrics has no {COUNTERS['consume_records']}: the records returned not checked"]
    if records_from_metrics != records:
        return [f"the brokers counted {records_from_metrics:g} records returned, the bodies hold {records}"]
    return []


def _reconciliation(problems: list[str]) -> dict:
    return {"reconciled": not problems, "unreconciled": problems}


def _high_watermark(reader: LogReader, topic: str, partition: int) -> int:
    try:
        return reader.high_watermark(topic, partition)
    except PartitionNotInitialized:  # nothing written to it yet
        return 0


def _cost_per_million(puts: float | None, gets: float | None, records: int) -> float | None:
    if puts is None or gets is None or not records:
        return None
    return round((puts * S3_PUT_USD + gets * S3_GET_USD) / records * 1e6, 6)


def _metrics_cost(before: list, after: list, records: int) -> dict:
    """The brokers' own S3 request cost estimate over the phase (``s3.billing`` in ``/metrics``,
    every PUT- and GET-class request, LISTs too), and per million records."""
    usd = counter_delta(before, after, "s3_cost_usd")
    return {"metrics_s3_cost_usd": None if usd is None else round(usd, 6),
            "metrics_s3_cost_usd_per_million_records": round(usd / records * 1e6, 6) if usd is not None and records
            else None}


def _flatten(value, prefix: str = "") -> dict[str, float]:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {prefix[:-1]: value}
    return {}


def _write_metrics_delta(out: Path, before: list[dict | None], after: list[dict | None]) -> None:
    """Every numeric ``/metrics`` value that changed during the phase, per broker, into
    ``metrics_delta.json`` (what the broker reported, whatever its keys are)."""
    deltas = []
    for b, a in zip(before, after):
        if a is None:
            deltas.append(None)
            continue
        fb, fa = _flatten(b or {}), _flatten(a)
        deltas.append({k: round(v - fb.get(k, 0), 6) for k, v in fa.items() if v != fb.get(k, 0)})
    (out / "metrics_delta.json").write_text(json.dumps(deltas, indent=1) + "\n")


# --- the whole run ----------------------------------------------------------------------------


def run(config: Config, scenarios: list[Scenario], run_dir: Path, brokers: int = 1,
        vegeta_binary: Path | None = None, balanced: bool = False, route: bool = True,
        processes: dict[str, int] | None = None) -> dict:
    """Start ``brokers`` brokers for ``config`` (``balanced``: behind HAProxy, ``route``: with the
    route key), run ``scenarios`` in order, stop them, write ``summary.json``; return the
    summary. ``processes``: other pids (name to pid) whose CPU each phase reports."""
    binary = vegeta_binary or vegeta.install()
    (run_dir / "targets").mkdir(exist_ok=True)
    (run_dir / "scenario.json").write_text(json.dumps({
        "scenarios": [asdict(s) for s in scenarios], "brokers": brokers, "vegeta": vegeta.VERSION,
        "balancer": "haproxy" if balanced else None, "route_key": PARTITION_HEADER if balanced and route else None,
        "root_prefix": config.root_prefix, "oxia": config.oxia_service_address, "s3": config.s3_endpoint_url,
        "batch_max_delay_ms": config.batch_max_delay_ms, "batch_max_bytes": config.batch_max_bytes,
        "cpus": os.cpu_count(), "load_average": os.getloadavg(), "python": platform.python_version(),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }, indent=1) + "\n")
    state = Run(run_dir, config, binary, balanced=balanced, route=route, processes=dict(processes or {}))
    state.sampler = MetricsSampler(run_dir / "metrics.jsonl")
    started = time.monotonic()
    phases: dict[str, dict] = {}
    exits = {}
    try:
        state.brokers = [state.start_broker(f"{i}") for i in range(brokers)]
        state.sampler.start()
        for scenario in scenarios:
            result = state.phase(scenario)
            phases[scenario.name] = result
            (run_dir / scenario.name / "phase.json").write_text(json.dumps(result, indent=1) + "\n")
            progress(f"{scenario.name}: {_headline(result)}")
    finally:
        state.sampler.stop()
        for balancer in state.balancers.values():
            exits[balancer.name] = balancer.stop()
        for broker in state.brokers:
            exits[broker.name] = broker.stop()
    summary = summarize(phases)
    summary.update({"run_dir": str(run_dir), "brokers": brokers, "balancer": "haproxy" if balanced else None,
                    "route_key": PARTITION_HEADER if balanced and route else None,
                    "seconds": round(time.monotonic() - started, 1),
                    "broker_exit_status": exits, "metrics_samples": state.sampler.samples,
                    "broker_log_errors": _log_errors(run_dir)})
    (run_dir / "summary.json").write_text(json.dumps(summary) + "\n")
    return summary


def summarize(phases: dict[str, dict]) -> dict:
    """The headline numbers (the bench's fields) from the phases, then the phases."""
    def get(phase: str, key: str):
        return phases.get(phase, {}).get(key)

    fixed = phases.get("produce-rate", {})
    unexpected = {name: p["non_200"] for name, p in phases.items() if name != "overload" and p.get("non_200")}
    return {
        "produce_records_per_s": get("produce-max", "records_per_s"),
        "produce_requests_per_s": get("produce-max", "ok_requests_per_s"),
        "produce_p50_ms": get("produce-max", "p50_ms"), "produce_p99_ms": get("produce-max", "p99_ms"),
        "produce_p999_ms": get("produce-max", "p999_ms"),
        "produce_ack_p50_ms": fixed.get("p50_ms"), "produce_ack_p99_ms": fixed.get("p99_ms"),
        "produce_ack_p999_ms": fixed.get("p999_ms"), "produce_rate_requests_per_s": fixed.get("ok_requests_per_s"),
        "produce_lone_p50_ms": get("produce-lone", "p50_ms"), "produce_lone_p99_ms": get("produce-lone", "p99_ms"),
        "consume_records_per_s": get("consume-hit", "records_per_s"),
        "consume_miss_records_per_s": get("consume-miss", "records_per_s"),
        "long_poll_e2e_p50_ms": get("long-poll", "e2e_p50_ms"), "long_poll_e2e_p99_ms": get("long-poll", "e2e_p99_ms"),
        "s3_puts_per_s": get("produce-max", "s3_puts_per_s"),
        "s3_puts_per_s_at_fixed_rate": fixed.get("s3_puts_per_s"),
        "s3_cost_usd_per_million_records": get("produce-max", "s3_cost_usd_per_million_records"),
        "consume_miss_s3_cost_usd_per_million_records": get("consume-miss", "s3_cost_usd_per_million_records"),
        "overload_503_retry_after": get("overload", "retry_after_503"),
        "overload_non_503_errors": get("overload", "overload_non_503_errors"),
        "unexpected_non_200": unexpected,
        # Every phase that counts records reconciles them (the long-poll probe counts none).
        "reconciled": all(p["reconciled"] is True for p in phases.values() if "reconciled" in p),
        "unreconciled": {name: p["unreconciled"] for name, p in phases.items() if p.get("unreconciled")},
        "phases": phases,
    }


def _headline(result: dict) -> str:
    keys = ("records_per_s", "ok_requests_per_s", "p50_ms", "p99_ms", "p999_ms", "status_counts", "s3_puts_per_s",
            "e2e_p50_ms", "e2e_p99_ms", "delivered", "overload_non_503_errors")
    return ", ".join(f"{k}={result[k]}" for k in keys if k in result)


def _log_errors(run_dir: Path) -> dict[str, int]:
    """Lines with ERROR or Traceback in each broker's log (a broker under load should have none)."""
    counts = {}
    for path in sorted(run_dir.glob("broker-*.log")):
        text = path.read_text(errors="replace")
        counts[path.stem] = sum(1 for line in text.splitlines() if "ERROR" in line or "Traceback" in line)
    return counts
