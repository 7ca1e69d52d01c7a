"""The broker's OpenAPI document (:mod:`broker_lite.openapi`): the checked-in copy is current, the
document is valid OpenAPI 3.1, names every model, and says what the server enforces (auth on
every route but /health and /openapi.json, Retry-After on every 503, llog's topic rule, base64)."""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from broker_lite import models, openapi
from llog.errors import InvalidTopicName
from llog.keys import validate_topic

REPO = Path(__file__).resolve().parents[2]
CHECKED_IN = REPO / "docs" / "openapi.json"
REGENERATE = "run `python -m broker_lite.openapi > docs/openapi.json`"


@pytest.fixture(scope="module")
def doc() -> dict:
    return openapi.document()


def _operations(doc: dict):
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


def test_checked_in_copy_is_current():
    assert CHECKED_IN.read_bytes() == openapi.document_bytes(), f"docs/openapi.json is stale: {REGENERATE}"


def test_module_prints_the_document():
    printed = subprocess.run([sys.executable, "-m", "broker_lite.openapi"], cwd=REPO, capture_output=True,
                             check=True).stdout
    assert printed == openapi.document_bytes()
    assert printed.endswith(b"}\n") and json.loads(printed) == openapi.document()
    assert printed == (json.dumps(json.loads(printed), indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def test_document_is_valid_openapi_3_1(doc):
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(doc)
    assert doc["openapi"].startswith("3.1.") and "servers" not in doc
    assert doc["info"]["version"] == importlib.metadata.version("llog")


def test_every_model_is_a_component(doc):
    structs = {name for name, obj in inspect.getmembers(models, inspect.isclass)
               if issubclass(obj, msgspec.Struct) and obj.__module__ == models.__name__}
    missing = structs - set(doc["components"]["schemas"])
    assert not missing, f"models not in the document (give them a route in broker_lite/openapi.py): {sorted(missing)}"


def test_every_ref_resolves(doc):
    refs = set(re.findall(r'"\$ref": "#/components/(\w+)/([\w-]+)"', json.dumps(doc)))
    assert refs and all(name in doc["components"][kind] for kind, name in refs)


def test_document_bytes_is_cached_and_document_is_a_copy():
    assert openapi.document_bytes() is openapi.document_bytes()
    openapi.document()["paths"].clear()
    assert openapi.document()["paths"]


def test_routes(doc):
    got = {(method.upper(), path) for path, method, _ in _operations(doc)}
    assert got == {("GET", "/health"), ("GET", "/metrics"), ("GET", "/metrics/prometheus"), ("GET", "/openapi.json"),
                   ("POST", "/produce"), ("POST", "/producers"), ("POST", "/consume"), ("POST", "/groups/{group}/commit"),
                   ("GET", "/groups/{group}"), ("GET", "/topics"), ("GET", "/topics/{topic}")}
    ids = [op["operationId"] for _, _, op in _operations(doc)]
    assert len(ids) == len(set(ids))


def test_statuses_per_route(doc):
    statuses = {(m.upper(), p): set(op["responses"]) for p, m, op in _operations(doc)}
    assert statuses["POST", "/produce"] == {"200", "400", "401", "403", "404", "409", "413", "503"}
    assert statuses["POST", "/consume"] == {"200", "400", "401", "403", "404", "413", "503"}
    assert statuses["GET", "/health"] == statuses["GET", "/openapi.json"] == {"200", "404", "503"}
    produce = doc["paths"]["/produce"]["post"]["responses"]
    bodies = {produce[s]["content"]["application/json"]["schema"]["$ref"] for s in ("200", "409", "503")}
    assert bodies == {"#/components/schemas/ProduceResponse"}
    assert produce["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert "text/plain; version=0.0.4" in doc["paths"]["/metrics/prometheus"]["get"]["responses"]["200"]["content"]


def test_every_503_says_when_to_retry_and_every_401_challenges(doc):
    headers = doc["components"]["headers"]
    for path, method, operation in _operations(doc):
        unavailable = operation["responses"]["503"]
        assert unavailable["headers"]["Retry-After"] == {"$ref": "#/components/headers/Retry-After"}, (method, path)
        if "401" in operation["responses"]:
            assert "WWW-Authenticate" in operation["responses"]["401"]["headers"]
    assert headers["Retry-After"]["required"] and headers["Retry-After"]["schema"]["type"] == "integer"


def test_auth_on_every_route_but_health_and_the_document(doc):
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}
    assert schemes["apiKey"] == {**schemes["apiKey"], "type": "apiKey", "in": "header", "name": "X-API-Key"}
    for path, method, operation in _operations(doc):
        if path in ("/health", "/openapi.json"):
            assert operation["security"] == [] and "401" not in operation["responses"]
        else:
            assert operation["security"] == [{"bearer": []}, {"apiKey": []}], (method, path)
            assert {"401", "403"} <= set(operation["responses"]), (method, path)
    assert "LLOG_BROKER_AUTH" in doc["info"]["description"]


def test_request_bodies_forbid_unknown_fields(doc):
    schemas = doc["components"]["schemas"]
    for path, method, operation in _operations(doc):
        if "requestBody" in operation:
            ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert operation["requestBody"]["required"]
            assert schemas[ref.rsplit("/", 1)[1]]["additionalProperties"] is False, (method, path)


def _matches(pattern: str, value: str) -> bool:
    """``pattern`` (anchored ``^...$``) as JSON Schema reads it: ECMA's ``$`` is the very end,
    Python's also matches before a final newline."""
    assert pattern.startswith("^") and pattern.endswith("$")
    return re.fullmatch(pattern[1:-1], value) is not None


def _accepts(schema: dict, value: str) -> bool:
    """The string checks of ``schema`` this test needs (pattern, not-enum, minLength)."""
    return (_matches(schema["pattern"], value) and value not in schema["not"]["enum"]
            and len(value) >= schema.get("minLength", 0))


@pytest.mark.parametrize("name", ["a", "orders", "a.b_c-D9", "...", "a" * 249, "", ".", "..", "a" * 250, "a/b",
                                  "a b", "é", "orders\n", "*"])
def test_topic_rule_in_the_document_is_llogs(doc, name):
    try:
        validate_topic(name)
        valid = True
    except InvalidTopicName:
        valid = False
    schemas = doc["components"]["schemas"]
    for model in ("ProduceGroup", "ConsumePartition", "GroupOffset"):
        assert _accepts(schemas[model]["properties"]["topic"], name) == valid, (model, name)
    for path, method, operation in _operations(doc):
        for parameter in operation.get("parameters", []):
            assert _accepts(parameter["schema"], name) == valid, (method, path, name)


@pytest.mark.parametrize("text", ["", "AA==", "AAE=", "AAEC", "////", "AB==", "A", "AA", "AA=", "A-_=", "AA==AA==",
                                  "AA\n==", " AA==", "AA==\n"])
def test_base64_pattern_is_what_msgspec_decodes(doc, text):
    schema = doc["components"]["schemas"]["Base64Record"]["properties"]["base64"]
    try:
        msgspec.json.decode(json.dumps(text).encode(), type=bytes)
        decodes = True
    except msgspec.ValidationError:
        decodes = False
    assert _matches(schema["pattern"], text) == decodes, text
