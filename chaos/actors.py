"""The processes of a chaos run: ``python -m chaos.actors ROLE --dir D --name N ...``.

Settings come from ``LLOG_*`` environment variables (the controller passes its config). Each
actor works until SIGTERM. A writer appends one JSON line per acknowledged group to
``D/acks/N.jsonl``, only after ``append_shared`` returned. What a reader or GC sees that the
protocol forbids (an unreadable or wrong record, a gap) goes to ``D/violations/N.jsonl``;
transient failures (a server restarting) are logged and retried. Every actor writes a ``begin``
line to ``D/activity/N.jsonl`` before each operation (an append, one partition's compaction pass,
a GC pass, one partition's read) and an ``end`` line, with what the operation did, after it: a
SIGKILL that leaves a ``begin`` last killed the actor mid-operation, and the ``end`` lines are
what the run counts as compactions completed and blobs GC deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import sys
import time
from pathlib import Path

from llog.compactor import Compactor
from llog.config import Config
from llog.errors import (
    AppendFailed, CorruptBatch, CorruptRecord, InconsistentReadState, ObjectNotFound, OffsetOutOfRange,
    PartitionNotInitialized,
)
from llog.gc import gc_pass
from llog.reader import LogReader
from llog.writer import AppendGroup, LogWriter

#: Errors that mean the log is damaged, not that a server is briefly away.
DAMAGE = (InconsistentReadState, CorruptBatch, CorruptRecord, ObjectNotFound)

_stopping = False


def _stop(*_):
    global _stopping
    _stopping = True


def record_value(name: str, seq: int, partition: int, i: int) -> bytes:
    """The unique value of record ``i`` of a writer's append ``seq`` to ``partition``."""
    return f"{name}:{seq}:{partition}:{i}".encode()


class _Lines:
    """Append-only JSON lines, flushed line by line."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1)

    def write(self, **fields) -> None:
        self._file.write(json.dumps(fields) + "\n")

    @contextlib.contextmanager
    def operation(self, name: str, **fields):
        """A ``begin`` line, then the block, then an ``end`` line with the fields the block put in
        the dict it was given (also when it raised; never when the process was killed)."""
        self.write(begin=name, **fields)
        did: dict = {}
        try:
            yield did
        finally:
            self.write(end=name, **fields, **did)


def _activity(args) -> _Lines:
    return _Lines(args.dir / "activity" / f"{args.name}.jsonl")


def _log(name: str, message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {name}: {message}", file=sys.stderr, flush=True)


def writer(args, config: Config) -> None:
    rng, acks, activity = random.Random(args.seed), _Lines(args.dir / "acks" / f"{args.name}.jsonl"), _activity(args)
    with LogWriter(config, auto_initialize=True) as log:
        for seq in range(1_000_000_000):
            if _stopping:
                return
            partitions = rng.sample(range(args.partitions), rng.randint(1, args.partitions))
            groups = [AppendGroup(args.topic, p, [record_value(args.name, seq, p, i) for i in range(rng.randint(1, 50))])
                      for p in partitions]
            # The operation ends once its acks are recorded: a kill before that was mid-append.
            with activity.operation("append", seq=seq) as did:
                try:
                    results = log.append_shared(groups)
                except AppendFailed as e:
                    _log(args.name, f"append {seq} partly failed: {e}")
                    results = e.results
                except Exception as e:  # noqa: BLE001 - a chaos run goes on; new values next time
                    _log(args.name, f"append {seq} failed: {type(e).__name__}: {e}")
                    results = []
                for r in results:
                    acks.write(name=args.name, seq=seq, partition=r.partition, start=r.start_offset, count=r.count)
                did.update(acked=len(results), of=len(groups))
            if not results:
                time.sleep(0.2)
                continue
            time.sleep(rng.uniform(0, 0.05))


def compactor(args, config: Config) -> None:
    activity = _activity(args)
    with Compactor(config, max_offsets=args.max_offsets) as c:
        while not _stopping:
            for p in range(args.partitions):
                try:
                    with activity.operation("compact", partition=p) as did:
                        done = c.compact_partition(args.topic, p, deadline=time.monotonic() + 5)
                        did.update(compactions=done.compactions, records=done.records, recoveries=done.recoveries)
                    if done.compactions:
                        _log(args.name, f"{args.topic}[{p}]: {done.compactions} compaction(s), {done.records} records")
                except Exception as e:  # noqa: BLE001 - the next pass resumes
                    _log(args.name, f"{args.topic}[{p}]: {type(e).__name__}: {e}")
            time.sleep(0.3)


def gc(args, config: Config) -> None:
    violations, activity = _Lines(args.dir / "violations" / f"{args.name}.jsonl"), _activity(args)
    with LogReader(config) as reader:
        while not _stopping:
            try:
                with activity.operation("gc") as did:
                    report = gc_pass(reader.coordination, reader.objects, config.root_prefix, config.gc_grace_ms)
                    did.update(deleted=report.deleted)
                if report.deleted:
                    _log(args.name, f"deleted {report.deleted} blob(s)")
            except InconsistentReadState as e:
                violations.write(actor=args.name, error=type(e).__name__, detail=str(e))
            except Exception as e:  # noqa: BLE001 - the next pass starts over
                _log(args.name, f"{type(e).__name__}: {e}")
            time.sleep(1)


def reader(args, config: Config) -> None:
    violations, activity = _Lines(args.dir / "violations" / f"{args.name}.jsonl"), _activity(args)
    following = {p: 1 for p in range(args.partitions)}
    with LogReader(config) as log:
        while not _stopping:
            for p, start in following.items():
                try:
                    with activity.operation("read", partition=p, start=start) as did:
                        records = log.read_range(args.topic, p, start)
                        did.update(records=len(records))
                except (OffsetOutOfRange, PartitionNotInitialized):
                    continue
                except DAMAGE as e:
                    violations.write(actor=args.name, partition=p, offset=start, error=type(e).__name__, detail=str(e))
                    continue
                except Exception as e:  # noqa: BLE001 - a server restarting; read again
                    _log(args.name, f"[{p}] from {start}: {type(e).__name__}: {e}")
                    continue
                for expected, r in enumerate(records, start):
                    if r.offset != expected or len(r.value.split(b":")) != 4:
                        violations.write(actor=args.name, partition=p, offset=expected, error="wrong record",
                                         detail=f"offset {r.offset}, value {r.value[:60]!r}")
                        break
                following[p] = start + len(records)
            time.sleep(0.2)


ROLES = {"writer": writer, "compactor": compactor, "gc": gc, "reader": reader}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m chaos.actors")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--topic", default="chaos")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-offsets", type=int, default=200)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _stop)
    ROLES[args.role](args, Config.load())


if __name__ == "__main__":
    main()
