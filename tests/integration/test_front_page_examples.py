"""The examples of the front page (README.md) and of docs/getting-started.md, run verbatim from
the Markdown as a newcomer runs them after ``make demo``, their output compared with what the
page says they print.

- The Spark example: the page's shell block (``export ...`` then ``.cache/venv/bin/python``) run
  by bash from the checkout, the Python block on the interpreter's standard input; the table
  ``show()`` prints must be the one in the block's comments.
- The curl example: each command run by bash, with one change: the broker listens on a free port,
  not 18090. Each answer must match the comment under its command, where ``...`` stands for
  anything.

Connection settings come from ``LLOG_*`` variables (the test stack's, with a root prefix of the
test's own), as they come from the stack's settings file after ``make demo``; the default of one
partition a topic is kept (a newcomer's stack has it). "After ``make demo``" is checked by the
names: no example writes a topic the demo writes, or one another example writes."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from uuid import uuid4

import pytest

from jobs import demo
from tests.helpers.broker_process import run_broker
from tests.helpers.jvm_startup import quick_start_env

REPO = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/getting-started.md")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_TOPIC = re.compile(r"""option\("topics?", "([^"]+)"\)|"topic": "([^"]+)\"""")


def _blocks(page: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in _FENCE.finditer((REPO / page).read_text())]


def _spark_example(page: str) -> tuple[str, str]:
    """The shell block that starts the interpreter and the Python block after it."""
    blocks = _blocks(page)
    for (lang, shell), (next_lang, code) in zip(blocks, blocks[1:]):
        if lang == "sh" and shell.rstrip().endswith(".cache/venv/bin/python") and next_lang == "python":
            return shell, code
    raise AssertionError(f"{page} has no Spark example (a shell block starting the venv's python, then a Python block)")


def _curl_example(page: str) -> str:
    for lang, block in _blocks(page):
        if lang == "sh" and block.startswith("curl "):
            return block
    raise AssertionError(f"{page} has no curl example")


def _commands_and_answers(block: str) -> list[tuple[str, str]]:
    """Each command of a shell block and the answer its comment lines show (joined, each line
    stripped: a continued comment line is indented)."""
    out: list[tuple[list[str], list[str]]] = []
    for line in block.splitlines():
        if line.startswith("#"):
            out[-1][1].append(line[1:].strip())
        elif not out or out[-1][1]:
            out.append(([line], []))
        else:
            out[-1][0].append(line)
    return [("\n".join(command), "".join(answer)) for command, answer in out]


def _matches(shown: str, printed: str) -> bool:
    """Whether ``printed`` is what ``shown`` shows, ``...`` standing for anything."""
    pattern = ".*".join(re.escape(part) for part in shown.split("..."))
    return re.fullmatch(pattern, printed, re.S) is not None


def _env(stack, **more) -> dict[str, str]:
    """The environment of a newcomer's shell after ``make demo``: the stack's settings (a root
    prefix of this test's own, the default partitions), no test's."""
    config = stack.replace(root_prefix=f"t{uuid4().hex[:12]}")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LLOG_", "PYSPARK_", "SPARK_")) and k != "PYTHONPATH"}
    # But the tests' JVM flags, which make a Spark driver start on less CPU and print nothing more
    # (tests/helpers/jvm_startup.py).
    return {**env, **quick_start_env(), **config.to_options(), "LLOG_SETTINGS_FILE": os.devnull, **more}


def _written_topics(text: str) -> set[str]:
    return {a or b for a, b in _TOPIC.findall(text)}


def test_no_example_writes_a_topic_the_demo_or_another_example_writes():
    demo_topics = set(demo.CORE_TOPICS.split(",")) | {demo.EVENTS_TOPIC}
    for page in PAGES:
        spark = _written_topics(_spark_example(page)[1])
        curl = _written_topics(_curl_example(page))
        assert spark and curl, f"{page}: an example names no topic"
        assert not spark & demo_topics and not curl & demo_topics, f"{page}: an example writes a topic of the demo"
        assert not spark & curl, f"{page}: two examples write the same topic"


@pytest.mark.parametrize("page", PAGES)
def test_the_spark_example_prints_the_table_the_page_shows(stack, page):
    shell, code = _spark_example(page)
    shown = [line[2:] for line in code.splitlines() if line.startswith(("# +", "# |"))]
    assert shown, f"{page}: the Spark example shows no output"
    run = subprocess.run(["bash", "-ec", shell], input=code, cwd=REPO, env=_env(stack), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = [line for line in run.stdout.splitlines() if line.startswith(("+", "|"))]
    assert printed == shown, run.stdout


@pytest.mark.parametrize("page", PAGES)
def test_the_curl_example_answers_what_the_page_shows(stack, page):
    # As `llog stack up --broker` starts it: the stack's settings, one partition by default.
    env = _env(stack)
    config = stack.replace(root_prefix=env["LLOG_ROOT_PREFIX"])
    with run_broker(config) as (url, _):
        steps = _commands_and_answers(_curl_example(page))
        assert [command.split()[2].split("/")[-1] for command, _ in steps] == ["produce", "consume"]
        for command, shown in steps:
            assert "localhost:18090" in command
            run = subprocess.run(["bash", "-ec", command.replace("localhost:18090", url.removeprefix("http://"))],
                                 cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
            assert run.returncode == 0, run.stderr
            json.loads(run.stdout)  # one JSON answer
            assert _matches(shown, run.stdout.strip()), f"{page}: {command}\nshows   {shown}\nprinted {run.stdout}"


def test_an_answer_that_differs_from_the_page_does_not_match():
    shown = '{"results":[{"topic":"t","ok":true,"start_offset":1,...}],"error_count":0}'
    assert _matches(shown, '{"results":[{"topic":"t","ok":true,"start_offset":1,"count":2}],"error_count":0}')
    assert not _matches(shown, '{"results":[{"topic":"t","ok":true,"start_offset":5,"count":2}],"error_count":0}')
    assert not _matches(shown, '{"results":[{"topic":"t","ok":true,"start_offset":1}],"error_count":1}')
