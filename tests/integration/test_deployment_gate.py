"""One deployment gate for every actor (docs/protocol.md section 9.2, "One G per deployment"): each
actor, driven through its public entry point against a root prefix set up with another ``G``, or
on a machine whose clock is off the S3 server's, is refused with :class:`GraceMismatch` (or
:class:`ClockSkew`) and writes nothing: no Oxia key, no S3 object."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from uuid import uuid4

import pyarrow as pa
import pytest

from compaction_job.job import JobOptions, compact_group, run
from llog import deployment
from llog.clock import ShiftedClock
from llog.config import Config
from llog.consumer_groups import commit_offsets, delete_offsets
from llog.coordination import Coordination
from llog.errors import ClockSkew, GraceMismatch
from llog.gc import gc_pass
from llog.keys import TopicPartition
from llog.objects import ObjectStore
from llog.process_clients import close_all
from llog.topics import create_topic, read_topic
from llog.writer import AppendGroup, LogWriter, StagedSlice, stage
from llog_sink.commit import commit_batch
from llog_sink.rows import SinkLayout
from llog_sink.task_writer import SinkCommitMessage, write_task
from llog_tools import cli
from tests.helpers.broker_process import broker_exit, free_port
from tests.helpers.stored import stored

#: The deployment's G; every actor here runs with half of it (the review's H2: a smaller G).
GRACE_MS = 60_000
ACTOR_GRACE_MS = GRACE_MS // 2
T = "orders"
GROUP = "billing"
SINK = "query-1"
#: GraceMismatch's message, as the CLI prints it.
MISMATCH = re.compile(rf"LLOG_GC_GRACE_MS={ACTOR_GRACE_MS}, but root prefix '\w+' was set up with {GRACE_MS}")


@dataclass
class Deployment:
    """A root prefix set up with ``G = GRACE_MS``: topic ``orders`` (2 partitions) with records, a
    consumer group's offsets, and a slice staged for a sink batch not yet committed."""

    config: Config
    topic_id: str
    staged: list[StagedSlice]


@pytest.fixture
def setup(stack) -> Deployment:
    config = stack.replace(root_prefix=f"t{uuid4().hex[:12]}", gc_grace_ms=GRACE_MS)
    with LogWriter(config) as writer:
        create_topic(writer.coordination, config.root_prefix, T, 2)
        writer.append(T, 0, [b"a", b"b", b"c"])
        writer.append(T, 1, [b"d"])
        commit_offsets(writer.coordination, config.root_prefix, GROUP, {TopicPartition(T, 0): 2})
        staged = writer.upload([AppendGroup(T, 1, [b"staged"])])
        topic_id = read_topic(writer.coordination, config.root_prefix, T).record.topic_id
    return Deployment(config, topic_id, staged)


@pytest.fixture(scope="module", autouse=True)
def _kept_clients(stack):
    yield
    close_all()  # the clients the sink's entry points kept must not outlive the stack


@pytest.fixture(scope="module")
def spark():
    from jobs.local_spark import local_spark

    session = local_spark("deployment-gate-tests")
    yield session
    session.stop()


@dataclass
class Actor:
    """What a case gets: the actor's config (the deployment's, with the actor's G) and the rest."""

    config: Config
    setup: Deployment
    request: pytest.FixtureRequest
    monkeypatch: pytest.MonkeyPatch
    capsys: pytest.CaptureFixture
    tmp_path: object

    def cli(self, *argv: str) -> None:
        """``llog ARGV`` (its main function) with the actor's config in the environment: refused."""
        self.monkeypatch.setenv("LLOG_SETTINGS_FILE", "/nonexistent")
        for name, value in self.config.to_options().items():
            self.monkeypatch.setenv(name, value)
        self.capsys.readouterr()
        status = cli.main(list(argv))
        err = self.capsys.readouterr().err
        assert status == 1 and MISMATCH.search(err), f"llog {' '.join(argv)}: exit {status}, stderr: {err}"


def _writer_append(a: Actor) -> None:
    with LogWriter(a.config) as writer:
        writer.append(T, 0, [b"x"])


def _writer_commit_staged(a: Actor) -> None:
    with LogWriter(a.config) as writer:
        writer.commit_staged(a.setup.staged)


def _writer_stage(a: Actor) -> None:
    objects = ObjectStore(a.config)
    try:
        stage(objects, a.config, [AppendGroup(T, 0, [b"x"])])
    finally:
        objects.close()


def _produce(a: Actor) -> None:
    lines = a.tmp_path / "lines.txt"
    lines.write_text("x\ny\n")
    a.cli("produce", T, "-p", "0", "--file", str(lines))


def _sink_driver(a: Actor) -> None:
    commit_batch(a.config, [SinkCommitMessage(0, SINK, list(a.setup.staged), records=1)], 0)


def _sink_task_rows() -> list[pa.RecordBatch]:
    return [pa.record_batch({"value": pa.array([b"r1", b"r2"]), "partition": pa.array([0, 1], pa.int32())})]


SINK_LAYOUT = SinkLayout(topic_option=T, has_topic_column=False, has_partition_column=True, partitions=2)


def _sink_executor(a: Actor) -> None:
    write_task(iter(_sink_task_rows()), SINK_LAYOUT, a.config, task_id=0, batch_id=0, sink_id=SINK)


def _compaction_job(a: Actor) -> None:
    run(a.request.getfixturevalue("spark"), JobOptions(), a.config)


def _compaction_job_task(a: Actor) -> None:
    group = [(T, p, a.setup.topic_id, True, True) for p in (0, 1)]
    compact_group(a.config, group, max_offsets=100, deadline_epoch=None)


def _gc_pass(a: Actor) -> None:
    objects = ObjectStore(a.config)
    try:
        with Coordination(a.config) as coordination:
            gc_pass(coordination, objects, a.config.root_prefix, GRACE_MS)  # a longer grace: still refused
    finally:
        objects.close()


def _commit_offsets(a: Actor) -> None:
    with Coordination(a.config) as coordination:
        commit_offsets(coordination, a.config.root_prefix, GROUP, {TopicPartition(T, 0): 3})


def _delete_offsets(a: Actor) -> None:
    with Coordination(a.config) as coordination:
        delete_offsets(coordination, a.config.root_prefix, GROUP)


def _broker(*args: str) -> Callable[[Actor], None]:
    def start(a: Actor) -> None:
        status, err = broker_exit(a.config, args=args, wait_s=20)
        assert status not in (None, 0) and "GraceMismatch" in err, f"broker {args}: exit {status}, stderr: {err}"

    return start


#: Every actor that runs a protocol step, by its public entry point. A case that is a CLI
#: command or a process checks the refusal itself; the others must raise GraceMismatch.
ACTORS: dict[str, Callable[[Actor], None]] = {
    "writer: append": _writer_append,
    "writer: commit_staged": _writer_commit_staged,
    "writer: stage": _writer_stage,
    "writer: llog produce": _produce,
    "sink driver: commit_batch": _sink_driver,
    "sink executor: write_task": _sink_executor,
    "compactor: llog compact": lambda a: a.cli("compact", T, "0"),
    "compaction job: run": _compaction_job,
    "compaction job: its task": _compaction_job_task,
    "gc: llog gc": lambda a: a.cli("gc"),
    "gc: gc_pass": _gc_pass,
    "retention: llog retention": lambda a: a.cli("retention"),
    "topic admin: llog topics create": lambda a: a.cli("topics", "create", "payments", "--partitions", "1"),
    "topic admin: llog topics alter": lambda a: a.cli("topics", "alter", T, "--partitions", "3"),
    "topic admin: llog topics delete": lambda a: a.cli("topics", "delete", T),
    "fence: llog fence": lambda a: a.cli("fence", T, "0"),
    "unfence: llog unfence": lambda a: a.cli("unfence", T, "0"),
    "consumer groups: llog groups reset": lambda a: a.cli("groups", "reset", GROUP, "--to", "earliest"),
    "consumer groups: commit_offsets": _commit_offsets,
    "consumer groups: delete_offsets": _delete_offsets,
    "HTTP broker: process start": _broker(),
    "Kafka listener: process start": _broker("--kafka-port", str(free_port())),
}
_REFUSES_ITSELF = {name for name, _ in ACTORS.items() if "llog " in name or "process start" in name}


@pytest.mark.parametrize("name", list(ACTORS))
def test_every_actor_with_another_g_is_refused_and_writes_nothing(name, setup, request, monkeypatch, capsys,
                                                                   tmp_path):
    actor = Actor(setup.config.replace(gc_grace_ms=ACTOR_GRACE_MS), setup, request, monkeypatch, capsys, tmp_path)
    with Coordination(setup.config) as coordination:
        objects = ObjectStore(setup.config)
        try:
            before = stored(coordination, objects, setup.config.root_prefix)
            if name in _REFUSES_ITSELF:
                ACTORS[name](actor)
            else:
                with pytest.raises(GraceMismatch, match=MISMATCH):
                    ACTORS[name](actor)
            after = stored(coordination, objects, setup.config.root_prefix)
        finally:
            objects.close()
    assert after == before, (f"{name} wrote: Oxia {sorted(after.oxia.items() - before.oxia.items())}, "
                             f"S3 {sorted(after.s3.keys() - before.s3.keys())}")


#: Actors whose machine's clock is off the S3 server's; each runs as another process would (its
#: own client identifier: a process passes the gate once per config).
CLOCK_ACTORS: dict[str, Callable[[Actor], None]] = {
    "sink executor: write_task": _sink_executor,
    "compaction job: run": _compaction_job,
    "compaction job: its task": _compaction_job_task,
}


@pytest.mark.parametrize("name", list(CLOCK_ACTORS))
def test_every_actor_on_a_machine_whose_clock_is_off_is_refused_and_writes_nothing(name, setup, request, monkeypatch,
                                                                                  capsys, tmp_path):
    ahead_s = GRACE_MS * deployment.MAX_SKEW_FRACTION / 1000 + 4  # the allowance, the Date's 2 s of slack, 2 more
    monkeypatch.setattr(deployment, "MACHINE_CLOCK", ShiftedClock(ahead_s))
    actor = Actor(setup.config.replace(client_identifier=f"clock-ahead-{uuid4().hex[:6]}"), setup, request,
                  monkeypatch, capsys, tmp_path)
    with Coordination(setup.config) as coordination:
        objects = ObjectStore(setup.config)
        try:
            before = stored(coordination, objects, setup.config.root_prefix)
            with pytest.raises(ClockSkew, match=r"clock is \+\d+\.\d s off the S3 server's"):
                CLOCK_ACTORS[name](actor)
            after = stored(coordination, objects, setup.config.root_prefix)
        finally:
            objects.close()
    assert after == before


def test_a_sink_executor_passes_the_gate_once_per_process_and_config(setup, monkeypatch):
    """The executor half of H4: a worker's first task checks its clock; later tasks in the same
    worker (the same config) do not check again, so the check costs nothing per task or row."""
    config = setup.config.replace(client_identifier=f"worker-{uuid4().hex[:6]}")
    first = write_task(iter(_sink_task_rows()), SINK_LAYOUT, config, task_id=0, batch_id=0, sink_id=SINK)
    assert len(first.slices) == 2
    monkeypatch.setattr(deployment, "MACHINE_CLOCK", ShiftedClock(3600))  # would be refused if checked again
    second = write_task(iter(_sink_task_rows()), SINK_LAYOUT, config, task_id=1, batch_id=0, sink_id=SINK)
    assert len(second.slices) == 2
    with pytest.raises(ClockSkew):  # another config is another check
        write_task(iter(_sink_task_rows()), SINK_LAYOUT, config.replace(client_identifier="other"), task_id=2,
                   batch_id=0, sink_id=SINK)


def test_gc_with_a_grace_below_the_deployments_g_is_refused_and_deletes_nothing(config):
    """gc_pass and collect_garbage delete by the grace period they are given: one below the G the
    gate checked (the config's) is refused before anything is read or deleted (section 9.2,
    step 4), so a blob staged by a writer and not yet committed (at most G/2 old) survives."""
    from llog.errors import GraceBelowG
    from llog.gc import collect_garbage
    from llog.reader import LogReader

    with LogWriter(config, auto_initialize=True) as w:
        w.initialize_partition(T, 0)
        staged = w.upload([AppendGroup(T, 0, [b"acked"])])
        time.sleep(1.2)
        with pytest.raises(GraceBelowG, match=rf"grace period 1 ms is below LLOG_GC_GRACE_MS={config.gc_grace_ms}"):
            gc_pass(w.coordination, w.objects, config.root_prefix, grace_ms=1)
        with pytest.raises(GraceBelowG, match=r"grace period 1000 ms is below LLOG_GC_GRACE_MS="):
            collect_garbage(w.objects, config.root_prefix, set(), grace_ms=1000)
        w.commit_staged(staged)  # acknowledged: the blob is far younger than G/2
    with LogReader(config) as reader:
        assert [r.value for r in reader.read_range(T, 0, 1)] == [b"acked"]


def test_gc_under_another_root_prefix_than_the_gate_checked_is_refused(config, stack):
    """The gate checks the config's root prefix; gc_pass and collect_garbage given another root
    would delete under a prefix whose G nobody compared (section 9.2, step 4): refused."""
    from llog.errors import RootPrefixMismatch
    from llog.gc import collect_garbage

    other = f"t{uuid4().hex[:12]}"
    objects = ObjectStore(config)
    try:
        with Coordination(config) as coordination:
            with pytest.raises(RootPrefixMismatch, match=rf"root prefix '{other}'.*'{config.root_prefix}'"):
                gc_pass(coordination, objects, other, config.gc_grace_ms)
            with pytest.raises(RootPrefixMismatch, match=rf"root prefix '{other}'"):
                collect_garbage(objects, other, set(), config.gc_grace_ms)
    finally:
        objects.close()
