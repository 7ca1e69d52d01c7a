"""A writer in its own process, for concurrency and crash tests.

``python -m tests.helpers.writer_process --writer W --topic T --partitions 0,1 --batches B
--records N`` appends B shared appends, each with N records per partition, and prints one JSON
line per acknowledged group, then one with its coordination client's counters (``stats``: CAS
conflicts among them). With ``--go FILE`` it connects, creates ``FILE.ready-W``, and waits for
``FILE`` before its first append, so that writers started one after another append together.
Settings come from LLOG_* environment variables; LLOG_FAILPOINT kills it at a named point.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from llog.config import Config
from llog.writer import AppendGroup, LogWriter

REPO = Path(__file__).resolve().parents[2]
#: How long a writer waits for its ``--go`` file.
GO_TIMEOUT_S = 120


def record_value(writer: str, batch: int, partition: int, i: int) -> bytes:
    return f"{writer}:{batch}:{partition}:{i}".encode()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writer", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", required=True)
    parser.add_argument("--batches", type=int, default=1)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--go", type=Path)
    args = parser.parse_args()
    partitions = [int(p) for p in args.partitions.split(",")]
    with LogWriter(Config.load(), auto_initialize=True) as writer:
        if args.go is not None:
            _wait_for_go(args.go, args.writer)
        for batch in range(args.batches):
            groups = [AppendGroup(args.topic, p, [record_value(args.writer, batch, p, i) for i in range(args.records)])
                      for p in partitions]
            for result in writer.append_shared(groups):
                print(json.dumps({"writer": args.writer, "batch": batch, "topic": result.topic,
                                  "partition": result.partition, "start": result.start_offset,
                                  "end": result.end_offset}), flush=True)
        print(json.dumps({"writer": args.writer, "stats": dict(writer.coordination.stats)}), flush=True)


def _wait_for_go(go: Path, writer: str) -> None:
    Path(f"{go}.ready-{writer}").touch()
    deadline = time.monotonic() + GO_TIMEOUT_S
    while not go.exists():
        if time.monotonic() > deadline:
            sys.exit(f"writer {writer}: no {go} within {GO_TIMEOUT_S} s")
        time.sleep(0.01)


def start(config: Config, writer: str, topic: str, partitions: list[int], batches: int, records: int,
          failpoint: str | None = None, go: Path | None = None) -> subprocess.Popen:
    """Start a writer process using exactly ``config`` (``go``: see the module doc)."""
    env = {"PATH": "/usr/bin:/bin", "LLOG_SETTINGS_FILE": "/nonexistent", **config.to_options()}
    if failpoint:
        env["LLOG_FAILPOINT"] = failpoint
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.writer_process", "--writer", writer, "--topic", topic,
         "--partitions", ",".join(map(str, partitions)), "--batches", str(batches), "--records", str(records),
         *(["--go", str(go)] if go is not None else [])],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def release_together(go: Path, writers: list[str], procs: list[subprocess.Popen], timeout_s: float = 60) -> None:
    """Wait until every writer started with ``go`` is connected and waiting, then let them all go."""
    deadline = time.monotonic() + timeout_s
    while not all(Path(f"{go}.ready-{w}").exists() for w in writers):
        exited = [p.args for p in procs if p.poll() is not None]
        assert not exited, f"a writer exited before it was ready: {exited}"
        assert time.monotonic() < deadline, f"writers not ready within {timeout_s} s"
        time.sleep(0.01)
    go.touch()


def stats(stdout: str) -> dict[str, int]:
    """The coordination counters a writer process printed last."""
    return json.loads(stdout.splitlines()[-1])["stats"]


def acked_records(stdout: str, records: int) -> list[tuple[str, int, int, bytes]]:
    """``(topic, partition, offset, value)`` of every record a writer process acknowledged."""
    out = []
    for line in stdout.splitlines():
        r = json.loads(line)
        if "stats" in r:
            continue
        assert r["end"] - r["start"] + 1 == records
        out += [(r["topic"], r["partition"], r["start"] + i, record_value(r["writer"], r["batch"], r["partition"], i))
                for i in range(records)]
    return out


if __name__ == "__main__":
    main()
