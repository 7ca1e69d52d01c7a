"""``python -m bench compaction``: the compactor against a plain copy of the same bytes.

Workload (issue): 8 partitions, each with 500 WAL entries of 1,000 records of 100 bytes in
shared blobs. The fill (not timed) is 500 ``append_shared`` calls, each appending 1,000 records
to each of the 8 partitions: one ~800 KB blob holding 8 bodies of ~100 KB, so every partition's
entry lies in a different blob. Each record starts with its partition and offset, so the
read-back check after compaction catches a record moved to the wrong offset.

Timed: compacting all partitions, ``THREADS`` (2, the machine's cores) partitions at a time:
each thread has its own :class:`~llog.compactor.Compactor` (as each Spark task of the compaction
job would) and compacts its partitions one after the other; a partition's 500 entries (500,000
offsets, under the default ``max_offsets``) become one compacted blob in one compaction, its
source blobs fetched 8 at a time by the compactor's reader. The baseline, in the same run with the
same parallelism: per partition, plain boto3 range GETs of the same byte ranges of the same
blobs (8 at a time), joined and PUT with boto3 as one object of the compacted blob's size.
``mb_s`` and ``raw_copy_mb_s`` count the source record (value) bytes, partitions x entries x
records x 100, at the median round; ``ratio`` is ``mb_s / raw_copy_mb_s``.

Compaction is destructive, so every round fills a fresh topic (not timed), then times the
compaction and the copy of that topic's blobs, in turn (:func:`~bench.report.timed_together`,
the order alternating from round to round), checks that every partition's index is now
COMPACTED entries and that sampled records read back equal, and deletes the round's objects.
A small warm-up round runs first. Stage timers on the compactors (thread-seconds summed over
partitions) say where compaction time goes: selecting entries in Oxia, fetching and decoding
the source bodies, concatenating, encoding (offsets and CRC), the PUT, the index swap ("other":
claim, control read, release, and a thread idle while the other finishes); the copy's are its
GETs and its join + PUT.

Sizes come from the environment for quick runs: ``BENCH_COMPACTION_PARTITIONS`` (8),
``..._ENTRIES`` (500 per partition), ``..._RECORDS_PER_ENTRY`` (1,000), ``..._RECORD_BYTES``
(100), ``..._ROUNDS`` (3), ``..._THREADS`` (2).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

import llog.compactor as compactor_module
from bench.report import emit, env_int, mb_s, progress, timed_together
from llog.clock import ShiftedClock
from llog.compactor import Compactor, PartitionCompaction
from llog.config import Config
from llog.keys import parse_s3_uri
from llog.objects import ObjectStore, make_s3_client
from llog.reader import LogReader
from llog.records import COMPACTED, WAL, IndexEntry, LocatedEntry
from llog.topics import create_topic
from llog.writer import AppendGroup, LogWriter
from llog_tools import progress as llog_progress

TOPIC = "bench"
STAMP_BYTES = 12  # big-endian offset (8 bytes) and partition (4 bytes) at the start of every record
GET_WORKERS = 8  # the compactor reader's default thread pool, for the baseline's GETs
WARM_ENTRIES = 10


@dataclass(frozen=True)
class Sizes:
    partitions: int
    entries: int
    records_per_entry: int
    record_bytes: int
    rounds: int
    threads: int

    @classmethod
    def from_env(cls) -> "Sizes":
        return cls(env_int("BENCH_COMPACTION_PARTITIONS", 8), env_int("BENCH_COMPACTION_ENTRIES", 500), env_int("BENCH_COMPACTION_RECORDS_PER_ENTRY", 1_000),
                   env_int("BENCH_COMPACTION_RECORD_BYTES", 100, STAMP_BYTES), env_int("BENCH_COMPACTION_ROUNDS", 3), env_int("BENCH_COMPACTION_THREADS", 2))

    @property
    def records(self) -> int:
        """Per partition."""
        return self.entries * self.records_per_entry

    @property
    def compacted_body_bytes(self) -> int:
        """One partition's compacted bytes-batch-v1 body: header, offsets, data."""
        return 12 + 4 * (self.records + 1) + self.records * self.record_bytes


# --- records that say where they belong ---------------------------------------------------------


class _Payloads:
    """Record ``offset`` of partition ``p``: a random per-partition body (the same for every
    entry) whose first bytes are the offset and the partition."""

    def __init__(self, sizes: Sizes):
        self.sizes = sizes
        rng = np.random.default_rng(7)
        self.bodies = [rng.integers(0, 256, (sizes.records_per_entry, sizes.record_bytes), dtype=np.uint8)
                       for _ in range(sizes.partitions)]
        n, width = sizes.records_per_entry, sizes.record_bytes
        self.value_offsets = pa.py_buffer(np.arange(0, width * (n + 1), width, dtype=np.int32))

    def _stamped(self, partition: int, first_offset: int, count: int) -> np.ndarray:
        """Records ``first_offset..first_offset+count-1`` of ``partition``, one row each; the
        rows are the body rows of those offsets' positions in their entry."""
        offsets = np.arange(first_offset, first_offset + count, dtype=np.int64)
        rows = self.bodies[partition][(offsets - 1) % self.sizes.records_per_entry].copy()
        rows[:, :8] = offsets.astype(">u8").view(np.uint8).reshape(count, 8)
        rows[:, 8:12] = np.frombuffer(np.array([partition], dtype=">u4").tobytes(), dtype=np.uint8)
        return rows

    def entry(self, partition: int, first_offset: int) -> pa.BinaryArray:
        n = self.sizes.records_per_entry
        data = self._stamped(partition, first_offset, n)
        return pa.Array.from_buffers(pa.binary(), n, [None, self.value_offsets, pa.py_buffer(data)])

    def expected(self, partition: int, first_offset: int, count: int) -> list[bytes]:
        return [row.tobytes() for row in self._stamped(partition, first_offset, count)]


# --- fill, index, cleanup -----------------------------------------------------------------------


def _fill(config: Config, topic: str, sizes: Sizes, payloads: _Payloads, entries: int) -> dict:
    """``entries`` calls of ``append_shared``, each one entry in every partition (one blob)."""
    started = time.perf_counter()
    n = sizes.records_per_entry
    with LogWriter(config, auto_initialize=True) as writer:
        create_topic(writer.coordination, config.root_prefix, topic, sizes.partitions, if_not_exists=True)
        for call in llog_progress.track(range(entries), f"compaction: filling {topic}", unit="appends"):
            first = call * n + 1
            results = writer.append_shared([AppendGroup(topic, p, payloads.entry(p, first))
                                            for p in range(sizes.partitions)])
            for r in results:
                if (r.start_offset, r.end_offset) != (first, first + n - 1):
                    raise AssertionError(f"fill: {topic}[{r.partition}] got offsets {r.start_offset}..{r.end_offset}, "
                                         f"expected {first}..{first + n - 1}")
        puts, put_bytes = writer.objects.stats["put"], writer.objects.stats["put_bytes"]
    return {"appends": entries, "s3_puts": puts, "blob_mb": round(put_bytes / max(puts, 1) / 1e6, 3),
            "seconds": round(time.perf_counter() - started, 1)}


def _index(reader: LogReader, topic: str, partition: int) -> list[LocatedEntry]:
    keys = reader.keys(topic, partition)
    found = reader.coordination.range_scan(keys.index(1), keys.index_end, keys.partition_key)
    return [LocatedEntry(keys.index_end_offset(v.key), IndexEntry.from_json(v.value, v.key)) for v in found]


def _check_index(index: list[LocatedEntry], kind: str, topic: str, partition: int, records: int) -> None:
    """``index`` covers exactly offsets ``1..records`` with entries of type ``kind``."""
    position = 1
    for e in index:
        if e.entry.type != kind or e.start_offset != position:
            raise AssertionError(f"{topic}[{partition}]: expected {kind} entries from offset {position}, found "
                                 f"a {e.entry.type} entry {e.start_offset}..{e.end_offset}")
        position = e.end_offset + 1
    if position != records + 1:
        raise AssertionError(f"{topic}[{partition}]: index covers offsets 1..{position - 1}, expected 1..{records}")


def _verify(reader: LogReader, topic: str, sizes: Sizes, payloads: _Payloads, rng: random.Random) -> int:
    """After compaction: every partition's index is COMPACTED entries covering all its offsets,
    and sampled records (the first and last entry's worth, a random window, random single
    offsets) read back equal to what was written. Returns how many records were compared."""
    n, total, compared = sizes.records_per_entry, sizes.records, 0
    for p in range(sizes.partitions):
        _check_index(_index(reader, topic, p), COMPACTED, topic, p, total)
        middle = rng.randint(1, max(1, total - n + 1))
        for start in sorted({1, middle, max(1, total - n + 1)}):
            count = min(n, total - start + 1)
            got = [r.value for r in reader.read_range(topic, p, start, start + count - 1)]
            if got != payloads.expected(p, start, count):
                bad = next(i for i, (a, b) in enumerate(zip(got, payloads.expected(p, start, count))) if a != b) \
                    if len(got) == count else None
                raise AssertionError(f"compaction: {topic}[{p}] offsets {start}..{start + count - 1} read back "
                                     f"{len(got)} records, first difference at offset "
                                     f"{start + bad if bad is not None else '?'}")
            compared += count
        for offset in rng.sample(range(1, total + 1), min(5, total)):
            if reader.read_offset(topic, p, offset).value != payloads.expected(p, offset, 1)[0]:
                raise AssertionError(f"compaction: {topic}[{p}] offset {offset} reads back different bytes")
            compared += 1
    return compared


def _delete(objects: ObjectStore, uris: set[str]) -> None:
    if uris:
        objects.delete_many(sorted(uris))


# --- stage timers -------------------------------------------------------------------------------


class _Stages:
    """Thread-seconds per compaction step, timed by wrapping one Compactor's steps. ``concat``
    is the time between the source values arriving and ``encode_body`` starting."""

    STEPS = ("select", "fetch_decode", "concat", "encode", "put", "index_swap")
    _encode_patched = False
    _by_thread: dict[int, "_Stages"] = {}

    def __init__(self, compactor: Compactor):
        self.seconds: Counter[str] = Counter()
        self._fetched_at = 0.0
        self._wrap(compactor, "_select", "select")
        self._wrap(compactor.reader, "entry_values", "fetch_decode", after=self._fetched)
        self._wrap(compactor.objects, "put", "put")
        self._wrap(compactor, "_finish", "index_swap")
        _Stages._patch_encode()

    def _wrap(self, owner: object, name: str, step: str, after=None) -> None:
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                self.seconds[step] += end - start
                if after is not None:
                    after(end)

        setattr(owner, name, timed)

    def _fetched(self, at: float) -> None:
        self._fetched_at = at
        _Stages._by_thread[threading.get_ident()] = self

    @classmethod
    def _patch_encode(cls) -> None:
        if cls._encode_patched:
            return
        encode = compactor_module.encode_body

        def timed_encode(records, compression="none"):
            start = time.perf_counter()
            stages = cls._by_thread.get(threading.get_ident())
            try:
                return encode(records, compression)
            finally:
                if stages is not None:
                    stages.seconds["concat"] += start - stages._fetched_at
                    stages.seconds["encode"] += time.perf_counter() - start

        compactor_module.encode_body = timed_encode
        cls._encode_patched = True


# --- the timed calls ----------------------------------------------------------------------------


def _compact_all(compactors: list[Compactor], topic: str, sizes: Sizes) -> list[PartitionCompaction]:
    """Thread ``t`` compacts partitions ``t, t + threads, ...`` one after the other."""

    def run(t: int) -> list[PartitionCompaction]:
        return [compactors[t].compact_partition(topic, p) for p in range(t, sizes.partitions, len(compactors))]

    with ThreadPoolExecutor(max_workers=len(compactors)) as pool:
        done = [d for part in pool.map(run, range(len(compactors))) for d in part]
    for d in done:
        if d.skipped_claimed or d.records != sizes.records:
            raise AssertionError(f"compaction of {topic}[{d.partition}]: {d}")
    return done


def _raw_copy(clients: list, bucket: str, sources: dict[int, list[LocatedEntry]], copy_prefix: str,
              sizes: Sizes, stages: Counter[str]) -> list[str]:
    """Per partition: boto3 range GETs of its entries' bytes, ``GET_WORKERS`` at a time, joined
    and PUT as one object of the compacted body's size; partitions as :func:`_compact_all`.
    Adds the thread-seconds of the GETs and of join + PUT to ``stages``."""
    size = sizes.compacted_body_bytes
    lock = threading.Lock()

    def get(client, e: LocatedEntry) -> bytes:
        bkt, key = parse_s3_uri(e.entry.data_key)
        lo, length = e.entry.byte_offset, e.entry.byte_length
        return client.get_object(Bucket=bkt, Key=key, Range=f"bytes={lo}-{lo + length - 1}")["Body"].read()

    def copy(client, getters: ThreadPoolExecutor, p: int) -> str:
        start = time.perf_counter()
        parts = list(getters.map(lambda e: get(client, e), sources[p]))
        fetched = time.perf_counter()
        excess = sum(map(len, parts)) - size  # the WAL bodies' headers and last offsets, not rewritten
        if excess > 0:
            parts[-1] = parts[-1][:len(parts[-1]) - excess]
        key = f"{copy_prefix}/{p}"
        client.put_object(Bucket=bucket, Key=key, Body=b"".join(parts))
        with lock:
            stages["get"] += fetched - start
            stages["join_put"] += time.perf_counter() - fetched
        return key

    def run(t: int) -> list[str]:
        with ThreadPoolExecutor(max_workers=GET_WORKERS) as getters:
            return [copy(clients[t], getters, p) for p in range(t, sizes.partitions, len(clients))]

    with ThreadPoolExecutor(max_workers=len(clients)) as pool:
        return [k for part in pool.map(run, range(len(clients))) for k in part]


# --- the case -----------------------------------------------------------------------------------


def _round(config: Config, sizes: Sizes, payloads: _Payloads, compactors: list[Compactor], clients: list,
           reader: LogReader, topic: str, entries: int, order_flip: bool, rng: random.Random,
           raw_stages: Counter[str]) -> dict:
    """Fill ``topic``, time its compaction and the raw copy in turn, verify, clean up."""
    round_sizes = Sizes(sizes.partitions, entries, sizes.records_per_entry, sizes.record_bytes, 1, sizes.threads)
    fill = _fill(config, topic, round_sizes, payloads, entries)
    sources = {p: _index(reader, topic, p) for p in range(sizes.partitions)}
    for p, index in sources.items():
        _check_index(index, WAL, topic, p, round_sizes.records)
    copy_prefix = f"{config.root_prefix}/raw-copy/{topic}"
    out: dict = {}
    fns = {
        "compaction": lambda: out.__setitem__("compaction", _compact_all(compactors, topic, round_sizes)),
        "raw_copy": lambda: out.__setitem__("raw_copy", _raw_copy(clients, config.s3_bucket, sources, copy_prefix,
                                                                  round_sizes, raw_stages)),
    }
    if order_flip:
        fns = dict(reversed(fns.items()))
    seconds = {name: s[0] for name, s in timed_together(fns, 1, warmup=0).items()}
    compared = _verify(reader, topic, round_sizes, payloads, rng)
    wal_blobs = {e.entry.data_key for index in sources.values() for e in index}
    compacted = {e.entry.data_key for p in range(sizes.partitions) for e in _index(reader, topic, p)}
    copies = {f"s3://{config.s3_bucket}/{k}" for k in out["raw_copy"]}
    _delete(reader.objects, wal_blobs | compacted | copies)
    return {"seconds": seconds, "done": out["compaction"], "fill": fill, "compared": compared}


def run(config: Config) -> dict:
    sizes = Sizes.from_env()
    config = config.replace(root_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    payloads = _Payloads(sizes)
    rng = random.Random(11)
    record_bytes = sizes.partitions * sizes.records * sizes.record_bytes
    progress(f"compaction: {sizes.partitions} partitions x {sizes.entries} entries x {sizes.records_per_entry} "
             f"records of {sizes.record_bytes} B ({record_bytes / 1e6:.0f} MB of records per round), "
             f"{sizes.threads} threads, {sizes.rounds} rounds")

    # The compactors' clock runs past the compaction lag G (docs/protocol.md section 6.1: only
    # entries older than G are compacted), so the data each round has just written is compacted
    # at once. Their own age checks of the blob they write read the same clock: unaffected.
    lagged = ShiftedClock(config.gc_grace_ms / 1000 + 60)
    compactors = [Compactor(config, clock=lagged) for _ in range(sizes.threads)]
    clients = [make_s3_client(config) for _ in range(sizes.threads)]
    rounds: list[dict] = []
    try:
        with LogReader(config) as reader:
            progress(f"compaction: warm-up round ({WARM_ENTRIES} entries per partition)")
            _round(config, sizes, payloads, compactors, clients, reader, f"{TOPIC}-warm", WARM_ENTRIES, False, rng,
                   Counter())
            stages = [_Stages(c) for c in compactors]  # from here on: the timed rounds only
            raw_stages: Counter[str] = Counter()
            gets0 = sum(c.objects.stats["get"] + c.objects.stats["range_get"] for c in compactors)
            puts0 = sum(c.objects.stats["put"] for c in compactors)
            for i in llog_progress.track(range(sizes.rounds), "compaction: timed rounds", unit="rounds"):
                progress(f"compaction: round {i + 1}/{sizes.rounds}: fill, then compaction and raw copy in turn")
                rounds.append(_round(config, sizes, payloads, compactors, clients, reader, f"{TOPIC}-{i}",
                                     sizes.entries, i % 2 == 1, rng, raw_stages))
                s = rounds[-1]["seconds"]
                progress(f"compaction: round {i + 1}: compaction {s['compaction']:.2f} s, "
                         f"raw copy {s['raw_copy']:.2f} s, fill {rounds[-1]['fill']['seconds']} s")
            gets = sum(c.objects.stats["get"] + c.objects.stats["range_get"] for c in compactors) - gets0
            puts = sum(c.objects.stats["put"] for c in compactors) - puts0
    finally:
        for c in compactors:
            c.close()
        for client in clients:
            client.close()

    done = [d for r in rounds for d in r["done"]]
    source_gets, source_entries = sum(d.source_gets for d in done), sum(d.source_entries for d in done)
    if gets != source_gets:
        raise AssertionError(f"compaction: the compactors' stores counted {gets} GETs, the compactions {source_gets}")
    times = {name: [r["seconds"][name] for r in rounds] for name in ("compaction", "raw_copy")}
    for name, seconds in times.items():
        emit({"bench": "compaction", "case": name, "rounds": len(seconds), "record_bytes_per_call": record_bytes,
              "median_s": round(statistics.median(seconds), 3), "min_s": round(min(seconds), 3),
              "max_s": round(max(seconds), 3), "mb_s": round(mb_s(record_bytes, seconds), 1)})
    thread_s = sum(times["compaction"]) * sizes.threads
    stage_s = {step: sum(s.seconds[step] for s in stages) for step in _Stages.STEPS}
    emit({"bench": "compaction", "case": "compaction_stages", "unit": "thread-seconds over all timed rounds",
          **{step: round(v, 3) for step, v in stage_s.items()},
          "other": round(thread_s - sum(stage_s.values()), 3), "threads_x_wall": round(thread_s, 3)})
    raw_thread_s = sum(times["raw_copy"]) * sizes.threads
    emit({"bench": "compaction", "case": "raw_copy_stages", "unit": "thread-seconds over all timed rounds",
          **{step: round(v, 3) for step, v in raw_stages.items()},
          "other": round(raw_thread_s - sum(raw_stages.values()), 3), "threads_x_wall": round(raw_thread_s, 3)})
    emit({"bench": "compaction", "case": "fill", **rounds[-1]["fill"],
          "seconds": [r["fill"]["seconds"] for r in rounds]})

    compaction, raw = mb_s(record_bytes, times["compaction"]), mb_s(record_bytes, times["raw_copy"])
    summary = {
        "bench": "compaction",
        "mb_s": round(compaction, 1), "raw_copy_mb_s": round(raw, 1), "ratio": round(compaction / raw, 3),
        "s3_gets_per_entry": round(source_gets / source_entries, 3),
        "records_per_s": round(sizes.partitions * sizes.records / statistics.median(times["compaction"])),
        "mb_s_counts": "record value bytes (partitions x entries x records x record size)",
        "partitions": sizes.partitions, "entries_per_partition": sizes.entries,
        "records_per_entry": sizes.records_per_entry, "record_bytes": sizes.record_bytes,
        "threads": sizes.threads, "rounds": sizes.rounds,
        "compacted_body_bytes_per_partition": sizes.compacted_body_bytes,
        "compactions": sum(d.compactions for d in done), "s3_puts": puts,
        "records_verified": sum(r["compared"] for r in rounds),
    }
    emit(summary)
    return summary
