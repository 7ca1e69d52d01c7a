"""Kafka's own command-line tools (Kafka 4.4's jars, as the benches resolve them: from Maven
Central the first time on a machine), run as the tests run them: a JVM per command, started
with the tests' quick flags (tests/helpers/jvm_startup.py), as a tool that lives a second wants."""

from __future__ import annotations

import subprocess

from bench.kafka_broker import _java, kafka_jars
from tests.helpers.jvm_startup import QUICK_START


def run_kafka_tool(main: str, *args: str, stdin: str | None = None, timeout_s: float = 180
                   ) -> subprocess.CompletedProcess:
    """Run Kafka's class ``main`` with ``args``; its exit status and output, as text."""
    classpath = ":".join(str(jar) for jar in kafka_jars())
    return subprocess.run([_java(), *QUICK_START.split(), "-cp", classpath, main, *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout_s)
