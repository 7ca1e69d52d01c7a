"""The broker against its own OpenAPI document: schemathesis fuzzes every operation of a real
broker process on the real stack (Oxia + versitygw) and checks each answer: no server error but a
documented 503, the status documented, the body and headers (Retry-After, WWW-Authenticate)
matching their schemas, schema-valid requests accepted and invalid ones refused.

The document is :func:`broker_lite.openapi.document` (loaded at import: schemathesis's pytest
integration parametrizes by operation at collection), and the broker must serve exactly it at
``GET /openapi.json`` when it serves that route. Routes the app does not serve answer 404, which
the document allows everywhere; so that the run stays meaningful as routes land, a probe finds
which operations the broker serves (their documented example answered with something other than
404), and the run must have seen each of those succeed (produce: 200 or 409). Auth: the broker
gets keys in ``LLOG_BROKER_AUTH`` and every fuzzed request carries one that may do everything;
when the broker enforces them (a probe without a key gets 401), schemathesis's ``ignored_auth``
check also verifies that every secured operation refuses requests without it, and each
operation's 401 and 403 are checked against the document.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from uuid import uuid4

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import ignored_auth, unsupported_method

from broker_lite import openapi
from tests.helpers.broker_process import run_broker

KEY = "schema-test-key"
NOBODY_KEY = "schema-test-nobody"
AUTH = json.dumps({"keys": [{"name": "schema-test", "key": KEY, "produce": ["*"], "consume": ["*"], "groups": ["*"],
                             "admin": True},
                            {"name": "nobody", "key": NOBODY_KEY}]})
HEADERS = {"Authorization": f"Bearer {KEY}"}
#: Per operation; a hypothesis run per generation phase (examples, coverage, fuzzing) and mode.
MAX_EXAMPLES = 50
#: Long polls are capped here, so a generated ``max_wait_ms`` cannot hold a case for the broker's cap.
MAX_WAIT_MS = 100
#: The statuses that show an operation did its job (not a 4xx refusal) for a valid request.
SUCCESS = {"produce": {200, 409}}


@dataclass
class Broker:
    url: str
    doc: dict
    #: operationId -> the status its documented example got (404: not served).
    probe: dict[str, int]
    auth_enforced: bool
    #: Whether the broker takes ``2.0`` where an integer goes (JSON Schema's ``integer`` does).
    whole_floats: bool
    #: operationId -> statuses the fuzz run saw.
    seen: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))


def _example_request(operation: dict, path: str) -> tuple[str, dict | None]:
    for parameter in operation.get("parameters", []):
        path = path.replace("{" + parameter["name"] + "}", parameter["example"])
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("example")
    return path, body


def _probe(client: httpx.Client, doc: dict) -> dict[str, int]:
    """Each operation's documented example, in the document's order of tags (produce first, so
    consume, groups and topics find the topic it wrote)."""
    answers = {}
    order = [t["name"] for t in doc["tags"]]
    operations = [(path, method, op) for path, methods in doc["paths"].items() for method, op in methods.items()]
    for path, method, operation in sorted(operations, key=lambda o: order.index(o[2]["tags"][0])):
        url, body = _example_request(operation, path)
        answers[operation["operationId"]] = client.request(method, url, json=body).status_code
    return answers


@pytest.fixture(scope="module")
def broker(stack, tmp_path_factory) -> Iterator[Broker]:
    config = stack.replace(root_prefix=f"t{uuid4().hex[:12]}")
    log = tmp_path_factory.mktemp("broker") / "broker.log"
    with run_broker(config, log=log, LLOG_BROKER_AUTH=AUTH) as (url, _):
        with httpx.Client(base_url=url, headers=HEADERS, timeout=30) as client:
            served = client.get("/openapi.json")
            doc = served.json() if served.status_code == 200 else openapi.document()
            if served.status_code == 200:
                assert doc == openapi.document(), "the broker serves a different document than broker_lite.openapi"
            probe = _probe(client, doc)
        assert probe["produce"] == 200, f"produce's example: {probe['produce']}"
        enforced = httpx.post(f"{url}/produce", json={"topic_partitions": []}, timeout=30).status_code == 401
        whole = {"topic_partitions": [{"topic": "orders", "partition": 0.0, "records": ["whole-float probe"]}]}
        whole_floats = httpx.post(f"{url}/produce", json=whole, headers=HEADERS, timeout=30).status_code == 200
        yield Broker(url, doc, probe, enforced, whole_floats)
        if log.exists():
            print(f"broker log (tail):\n{log.read_text(errors='replace')[-3000:]}")


schema = schemathesis.openapi.from_dict(openapi.document(), config=schemathesis.Config.from_dict({
    "headers": HEADERS,
    "request-timeout": 30,
    # The key goes in HEADERS; generated Authorization/X-API-Key values would only get 401s.
    "generation": {"max-examples": MAX_EXAMPLES, "database": "none", "with-security-parameters": False},
    "checks": {
        # The seed's contract answers 404 for an unknown method on a path; the check wants 405.
        "unsupported_method": {"enabled": False},
        # 503 (with Retry-After) is a documented answer: backpressure, shutting down.
        "not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "503"]},
    },
}))


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented(case, broker):
    body = case.body
    if case.operation.path == "/consume" and isinstance(body, dict) and isinstance(body.get("max_wait_ms"), int):
        body["max_wait_ms"] = min(body["max_wait_ms"], MAX_WAIT_MS)
    if not broker.whole_floats:
        case.body = _whole_floats_as_ints(body)
    response = case.call(base_url=broker.url, headers=HEADERS)
    broker.seen[case.operation.definition.raw["operationId"]][response.status_code] += 1
    excluded = [unsupported_method] + ([] if broker.auth_enforced else [ignored_auth])
    case.validate_response(response, headers=HEADERS, excluded_checks=excluded,
                           transport_kwargs={"base_url": broker.url, "headers": HEADERS})


@pytest.mark.parametrize("who", ["no key", "a key without permissions"])
def test_refusals_answer_as_documented(broker, who):
    """401 (with its challenge) and 403 for each operation's example, each answer as documented:
    the fuzz run above sends a key that may do everything."""
    if not broker.auth_enforced:
        pytest.skip("the broker does not enforce LLOG_BROKER_AUTH")
    headers = {} if who == "no key" else {"X-API-Key": NOBODY_KEY}
    for path, methods in broker.doc["paths"].items():
        for method, definition in methods.items():
            url, body = _example_request(definition, path)
            response = httpx.request(method, broker.url + url, json=body, headers=headers, timeout=30)
            if not definition["security"]:
                expected = 200
            elif who == "no key":
                expected = 401
            else:
                expected = 200 if definition["operationId"] == "listTopics" else 403
            assert response.status_code == expected, (method, path, response.text)
            if expected == 401:
                assert response.headers["www-authenticate"].startswith('Bearer realm="llog"')
            if expected == 403:
                assert "nobody" in response.json()["error"]
            schema[path][method.upper()].validate_response(response)
    if who != "no key":
        assert httpx.get(f"{broker.url}/topics", headers=headers).json() == {"topics": []}


def _whole_floats_as_ints(value):
    """``value`` with every whole float (``2.0``) an int: schemathesis sends integers both ways
    (JSON Schema's ``integer`` admits ``2.0``), and while the broker refuses the float spelling
    with 400 (msgspec's strict ``int``) that is a known gap, not news each run."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_floats_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_floats_as_ints(v) for v in value]
    return value


def test_the_run_reached_every_operation_the_broker_serves(broker):
    """After the fuzz run: every operation was tried, and each one the broker serves succeeded
    at least once (its documented example does, so a run that never does is not fuzzing it)."""
    operations = {op["operationId"] for methods in broker.doc["paths"].values() for op in methods.values()}
    assert set(broker.seen) == operations, f"never tried: {sorted(operations - set(broker.seen))}"
    served = {op for op, status in broker.probe.items() if status != 404}
    assert {"health", "produce"} <= served, broker.probe
    for op in sorted(served):
        expected = SUCCESS.get(op, {200})
        assert expected & set(broker.seen[op]), f"{op}: no {sorted(expected)} in {dict(broker.seen[op])}"
    print(f"served: {sorted(served)}; auth enforced: {broker.auth_enforced}; whole floats taken: "
          f"{broker.whole_floats}; statuses: "
          f"{ {op: dict(c) for op, c in sorted(broker.seen.items())} }")
