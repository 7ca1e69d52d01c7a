"""The reference broker's README examples, run as a new user runs them: its ``curl`` commands, copied
verbatim (only the port differs: the test's broker listens on a free one), against a broker
started as ``llog stack up --broker`` starts it (``python -m broker_lite``, the default
``LLOG_DEFAULT_PARTITIONS=1``), with the real ``curl``.

The produce names partitions 0 and 1 of a topic that does not exist: the reference broker
initializes any partition on its first write, llog creates the topic on first use with enough
partitions for the write (docs/protocol.md section 10.2). The README is
``diskless-kafka-in-python``'s (section "HTTP Services", "Broker")."""

from __future__ import annotations

import base64
import json
import subprocess

import pytest

from llog.topics import read_topic
from llog.coordination import Coordination
from tests.helpers.broker_process import run_broker

#: The README's produce example, verbatim.
PRODUCE = """\
curl -X POST http://127.0.0.1:8080/produce \\
  -H 'content-type: application/json' \\
  -d '{
    "topic_partitions": [
      {
        "topic": "orders",
        "partition": 0,
        "records": ["alpha", "beta"]
      },
      {
        "topic": "orders",
        "partition": 1,
        "records": [{"base64": "AAE="}]
      }
    ]
  }'
"""

#: The README's consume example, verbatim.
CONSUME = """\
curl -X POST http://127.0.0.1:8080/consume \\
  -H 'content-type: application/json' \\
  -d '{
    "topic_partitions": [
      {
        "topic": "orders",
        "partition": 0,
        "fetch_offset": 1,
        "partition_max_bytes": 1048576
      },
      {
        "topic": "orders",
        "partition": 1,
        "fetch_offset": 1
      }
    ],
    "max_wait_ms": 250,
    "min_bytes": 1,
    "max_bytes": 4194304
  }'
"""

README_URL = "http://127.0.0.1:8080"


@pytest.fixture(scope="module")
def broker(module_config):
    """A broker as ``llog stack up --broker`` runs it: the stack's settings, no partition count set."""
    with run_broker(module_config, LLOG_DEFAULT_PARTITIONS=1) as (url, _):
        yield url


def curl(command: str, url: str, tmp_path) -> tuple[int, dict]:
    """Run a README command against ``url`` with the real curl; its status and JSON body. The
    status and a deadline come from a ``.curlrc`` (``CURL_HOME``), so the command stays as written."""
    (tmp_path / ".curlrc").write_text('silent\nshow-error\nmax-time = 30\nwrite-out = "\\n%{http_code}"\n')
    done = subprocess.run(["bash", "-c", command.replace(README_URL, url)], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "CURL_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    body, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(body)


def record_bytes(record: dict) -> bytes:
    """A consumed record's bytes: ``{"payload": str}`` (UTF-8) or ``{"base64": str}``."""
    return base64.b64decode(record["base64"]) if "base64" in record else record["payload"].encode()


def test_the_readme_produce_and_consume_examples_work_on_a_fresh_stack(module_config, broker, tmp_path):
    status, produced = curl(PRODUCE, broker, tmp_path)
    assert status == 200, produced
    assert (produced["success_count"], produced["error_count"]) == (2, 0)
    assert [(r["topic"], r["partition"], r["ok"], r["start_offset"], r["end_offset"], r["count"])
            for r in produced["results"]] == [("orders", 0, True, 1, 2, 2), ("orders", 1, True, 1, 1, 1)]
    with Coordination(module_config) as coordination:
        record = read_topic(coordination, module_config.root_prefix, "orders").record
    assert (record.partitions, record.auto_created) == (2, True)

    status, consumed = curl(CONSUME, broker, tmp_path)
    assert status == 200, consumed
    assert (consumed["success_count"], consumed["error_count"]) == (2, 0)
    zero, one = consumed["results"]
    assert (zero["partition"], zero["ok"], zero["high_watermark"], zero["next_fetch_offset"]) == (0, True, 2, 3)
    assert zero["records"] == [{"offset": 1, "payload": "alpha"}, {"offset": 2, "payload": "beta"}]
    assert (one["partition"], one["ok"], one["high_watermark"], one["next_fetch_offset"]) == (1, True, 1, 2)
    # The bytes 00 01 are valid UTF-8, so llog answers them as a payload string; the reference's
    # HTTP_API shows {"base64": "AAE="} for them. Either form is those bytes.
    assert [(r["offset"], record_bytes(r)) for r in one["records"]] == [(1, b"\x00\x01")]

    # Run again, as a user repeating the example does: offsets go on.
    status, again = curl(PRODUCE, broker, tmp_path)
    assert status == 200 and [r["start_offset"] for r in again["results"]] == [3, 2], again
