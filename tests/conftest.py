"""Shared fixtures: one local stack (real Oxia + versitygw) per test session."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from uuid import uuid4

import pytest

from llog import failpoints
from llog.config import Config
from llog_tools.local_stack import down, up
from llog_tools.stack.build import install
from llog_tools.stack.network import free_ports

_TESTS_DIR = Path(__file__).parent
_INTEGRATION_DIR = _TESTS_DIR / "integration"
#: Seconds each test module took in a whole run of the suite, on this 2-core machine: the
#: order the modules are handed to xdist's workers in (the longest first, so that no long one
#: starts last), and which ones ``make test-fast`` leaves out. ``make test-durations`` writes it
#: again from the last ``make test``'s report.
DURATIONS_FILE = _TESTS_DIR / "durations.json"
#: A module that took longer than this is ``slow``: ``make test-fast`` (``-m "not slow and not
#: soak"``) leaves it out. A module not in :data:`DURATIONS_FILE` (a new one) is not slow.
SLOW_MODULE_S = 8.0
#: The modules of long runs under load or faults (the chaos run, the Oxia cluster's kills, brokers
#: behind HAProxy under load, the load test, the Kafka front-door bench): marked ``soak``. ``make
#: test`` runs them alone after the rest (the Makefile says why); in one xdist run they are one
#: unit, which one worker runs one after another.
SOAK_MODULES = frozenset(f"tests/integration/{name}.py" for name in (
    "test_chaos", "test_oxia_cluster", "test_broker_scaleout", "test_loadtest", "test_bench_kafka_front_door"))
#: What the scheduler calls the soak modules together.
SOAK_GROUP = "soak"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: needs real processes (Oxia, S3, Spark)")
    config.addinivalue_line("markers", "soak: in a module of long runs under load or faults (SOAK_MODULES); "
                                       "`make test` runs them alone, after the rest")
    config.addinivalue_line("markers", f"slow: in a module that took over {SLOW_MODULE_S:.0f} s in a whole run "
                                       "(tests/durations.json); left out of `make test-fast`")
    if not os.environ.get("SPARK_SUBMIT_OPTS") and not config.option.collectonly:
        # Spark drivers that start on a third of the CPU (tests/helpers/jvm_startup.py); xdist's
        # workers, started after this, inherit it.
        from tests.helpers.jvm_startup import spark_submit_opts

        os.environ["SPARK_SUBMIT_OPTS"] = spark_submit_opts()


def _module(item: pytest.Item) -> str:
    return item.path.relative_to(_TESTS_DIR.parent).as_posix()


def _recorded() -> dict[str, dict[str, float]]:
    return json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.is_file() else {}


_RECORDED = _recorded()


def _group(module: str) -> str:
    return SOAK_GROUP if module in SOAK_MODULES else module


def _name_by_its_parameters(item: pytest.Item) -> None:
    """Give a test whose name carries parameters the node id that says them. Schemathesis's
    tests (one per operation, test_broker_schema.py) set them in a way pytest 9 no longer reads
    back: all eleven had one node id, and pytest-xdist, which tells tests apart by node id, ran
    one of them and dropped the rest without a word."""
    _, bracket, params = item.name.partition("[")
    if bracket and "[" not in item.nodeid and hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(f"{item.nodeid}[{params}")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark each test as it is collected: ``integration`` by its directory, ``soak`` by its
    module, ``slow`` by its module's recorded time."""
    module = _module(item)
    _name_by_its_parameters(item)
    if _INTEGRATION_DIR in item.path.parents:
        item.add_marker(pytest.mark.integration)
    if module in SOAK_MODULES:
        item.add_marker(pytest.mark.soak)
    if _RECORDED.get("modules", {}).get(module, 0.0) > SLOW_MODULE_S:
        item.add_marker(pytest.mark.slow)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the tests by their group's recorded time, the longest first (the scheduler below
    hands the groups to the workers in this order); a module not recorded counts the median."""
    modules = _RECORDED.get("modules", {})
    unknown = statistics.median(modules.values()) if modules else 0.0
    groups: dict[str, set[str]] = {}
    for item in items:
        groups.setdefault(_group(_module(item)), set()).add(_module(item))
    cost = {group: sum(modules.get(module, unknown) for module in members) for group, members in groups.items()}
    items.sort(key=lambda item: -cost[_group(_module(item))])  # stable: a module's tests as written


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's scheduler for ``make test``: a test module is one unit of work, run on one
    worker in the order it is written (its module fixtures start once), and the soak modules are
    one unit together; units go out in collection order (the longest first, above). xdist's own
    ``--dist loadgroup`` does not group under pytest 9 (it renames a test's node id, which pytest
    9 no longer reads back), so the grouping is done here, by module path."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid.split("::", 1)[0])

    return ModuleScheduling(config, log)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """A running local stack on free ports, as the config that reaches it."""
    install()
    stack_dir = tmp_path_factory.mktemp("stack")
    up(stack_dir=stack_dir, ports=free_ports())
    try:
        yield Config.load(env={}, settings_path=stack_dir / "settings.json")
    finally:
        down(stack_dir, purge=True)


#: Partitions of a topic a test creates by writing to it: tests write to partitions 0..15 of the
#: topics they make up (as a test Kafka cluster raises ``num.partitions``); tests of the default
#: (1, docs/protocol.md section 10) set ``default_partitions`` themselves.
TEST_DEFAULT_PARTITIONS = 16


@pytest.fixture
def config(stack: Config) -> Config:
    """The stack's config with a root prefix of its own, so tests do not see each other's data."""
    return stack.replace(root_prefix=f"t{uuid4().hex[:12]}", default_partitions=TEST_DEFAULT_PARTITIONS)


@pytest.fixture
def hooks():
    """``llog.failpoints.hooks``, emptied after the test: ``hooks[point] = fn`` runs ``fn`` when
    this process reaches ``point`` (an actor pauses there while ``fn`` runs others)."""
    failpoints.hooks.clear()
    yield failpoints.hooks
    failpoints.hooks.clear()
