"""The broker's OpenAPI 3.1 document, built from the msgspec Structs the server decodes and
encodes with (:mod:`broker_lite.models`) plus the route table below: one source of truth for
the shapes, so the document cannot drift from what the server checks.

``python -m broker_lite.openapi`` prints it (``docs/openapi.json`` is the checked-in copy,
compared by ``tests/unit/test_broker_openapi.py``); the app serves :func:`document_bytes` at
``GET /openapi.json``.

What the Structs cannot say is added here, each rule from the code that enforces it: llog's topic
rule (:func:`llog.keys.validate_topic`, checked when a request is admitted) on every request
``topic`` and on the ``{topic}``/``{group}`` path parameters, a base64 ``pattern`` on every
base64 string (msgspec's decoder wants standard, padded base64), and a produce's producer id and
sequences, both or neither (:data:`CROSS_FIELD_RULES`, checked by the app).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from broker_lite import models
from broker_lite.auth import ENV_VAR as AUTH_ENV_VAR
from llog.keys import MAX_TOPIC_LENGTH

REF_TEMPLATE = "#/components/schemas/{name}"
JSON = "application/json"
PROMETHEUS = "text/plain; version=0.0.4"

#: llog's topic (and group id) rule as JSON Schema: Kafka's, docs/protocol.md section 1.
NAME_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": f"^[A-Za-z0-9._-]{{1,{MAX_TOPIC_LENGTH}}}$",
    "not": {"enum": [".", ".."]},
}
#: Standard base64 with padding, what msgspec decodes into ``bytes``.
BASE64_PATTERN = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"

#: What a Struct cannot say about its fields together, by component: a produce is idempotent
#: (``producer_id`` and every group's ``sequence``) or plain (neither), as the app checks.
CROSS_FIELD_RULES: dict[str, dict[str, Any]] = {"ProduceRequest": {"anyOf": [
    {"title": "idempotent", "required": ["producer_id"], "properties": {
        "producer_id": {"type": "string"},
        "topic_partitions": {"items": {"required": ["sequence"], "properties": {"sequence": {"type": "integer"}}}}}},
    {"title": "plain", "properties": {
        "producer_id": {"type": "null"},
        "topic_partitions": {"items": {"properties": {"sequence": {"type": "null"}}}}}},
]}}

#: Bodies that are not Structs: ``GET /metrics``'s free-form counters, grouped as the seed groups
#: them (the reference broker's HTTP API).
EXTRA_SCHEMAS: dict[str, dict[str, Any]] = {"MetricsSnapshot": {
    "title": "MetricsSnapshot",
    "description": "The broker's counters as JSON, grouped like the seed's snapshot; the same numbers "
                   "as /metrics/prometheus.",
    "type": "object",
    "properties": {part: {"type": "object"} for part in ("broker", "http", "batching", "writer", "oxia", "s3")},
    "required": ["broker", "http", "batching", "writer", "oxia", "s3"],
}}


@dataclass(frozen=True)
class Answer:
    """One documented response: a status, its body (a Struct, or a raw schema for non-Struct
    bodies) and whether it carries ``Retry-After``."""

    status: int
    description: str
    model: type | None = None
    schema: dict[str, Any] | None = None
    media_type: str = JSON
    retry_after: bool = False


@dataclass(frozen=True)
class Route:
    operation_id: str
    method: str
    path: str
    summary: str
    tag: str
    answers: tuple[Answer, ...]
    description: str = ""
    request: type | None = None
    #: False for ``/health`` and ``/openapi.json``: every other route takes a key when auth is on.
    secured: bool = True
    #: Path parameters, each with the name rule.
    params: tuple[str, ...] = field(default=())
    #: Examples: the request body, and each path parameter's value (they name the same topic and
    #: group, so a client trying them in order gets answers with data).
    example: dict[str, Any] | None = None


def _error(status: int, description: str, retry_after: bool = False) -> Answer:
    return Answer(status, description, models.ErrorBody, retry_after=retry_after)


def _any_of(*models_: type) -> dict[str, Any]:
    """A body that is one of ``models_`` (``anyOf``: a ProduceResponse with its error fields
    also has an ErrorBody's)."""
    return {"anyOf": [{"$ref": REF_TEMPLATE.format(name=m.__name__)} for m in models_]}


_BAD_BODY = _error(400, "No Content-Length (a chunked body), an empty or malformed body, a body that does not "
                        "match the request shape, or a topic outside llog's naming rule; the error names the field.")
_TOO_LARGE = _error(413, "Content-Length over LLOG_BROKER_MAX_REQUEST_BYTES; refused before the body is read.")
_BAD_NAME = _error(400, "A path name outside llog's naming rule (the topic rule).")
PARAM_EXAMPLES = {"topic": "orders", "group": "reports"}

ROUTES: tuple[Route, ...] = (
    Route("health", "get", "/health", "Liveness", "operations", secured=False, answers=(
        Answer(200, "The broker process is up.", models.Health),)),
    Route("metrics", "get", "/metrics", "Counters as JSON", "operations", answers=(
        Answer(200, "The counters, grouped as broker, http, batching, writer, oxia and s3.",
               schema={"$ref": REF_TEMPLATE.format(name="MetricsSnapshot")}),)),
    Route("metricsPrometheus", "get", "/metrics/prometheus", "Counters in the Prometheus text format", "operations",
          answers=(Answer(200, "Prometheus text exposition 0.0.4.", schema={"type": "string"},
                          media_type=PROMETHEUS),)),
    Route("openapi", "get", "/openapi.json", "This document", "operations", secured=False, answers=(
        Answer(200, "The OpenAPI 3.1 document.", schema={"type": "object"}),)),
    Route("produce", "post", "/produce", "Append records to topic-partitions", "produce",
          request=models.ProduceRequest,
          example={"topic_partitions": [{"topic": "orders", "partition": 0, "records": ["alpha", {"base64": "AAE="}]}]},
          description="Every topic-partition group of the request is committed with the others in one group "
                      "commit; the answer comes once its records are durable. A topic without a topic record is "
                      "created on its first produce (unless LLOG_AUTO_CREATE_TOPICS is false) with "
                      "LLOG_DEFAULT_PARTITIONS partitions or enough for the partitions the produce names, whichever "
                      "is more, and a topic so created grows when a produce names a higher partition, up to "
                      "LLOG_MAX_AUTO_PARTITIONS partitions. A group for a partition at or past the partition count "
                      "of a topic created explicitly (llog topics create), or past that limit, fails with "
                      "UnknownPartition, one for a topic being deleted with TopicBeingDeleted. "
                      "With a producer_id (chosen by the client, or from POST /producers) and a sequence in every "
                      "group, the produce is idempotent, as Kafka's idempotent producer: per producer and "
                      "partition, each group's sequence must be where the last group ended (its sequence plus its "
                      "record count, wrapping to 0 after 2147483647 as Kafka's; any sequence for a producer the "
                      "partition does not know). A group sent again "
                      "with the same sequence and records, to this broker or another, also after the broker that "
                      "took it died, is answered with the offsets it got the first time (duplicate: true) and "
                      "written once; an older group the partition knows it wrote fails with DuplicateSequence, a "
                      "gap or any other sequence with OutOfOrderSequence. A partition keeps each producer's last "
                      "group for 7 days after its last write, and its 128 most recent producers: a resend from a "
                      "producer forgotten since is written again. Served by --role write and both.",
          answers=(
              Answer(200, "Every group committed, each with its offsets.", models.ProduceResponse),
              Answer(404, "Every group names a topic or partition that does not exist (UnknownPartition: past the "
                          "topic's partition count; TopicNotFound: no topic record and auto-creation is off): a "
                          "ProduceResponse with each group's error, and the first as error_type and error; nothing "
                          "written. Or, as an ErrorBody, no such path or a role that does not serve it.",
                     schema=_any_of(models.ProduceResponse, models.ErrorBody)),
              Answer(409, "At least one group failed (each result says why: LogFenced, TopicBeingDeleted, "
                          "UnknownPartition, OutOfOrderSequence, DuplicateSequence...); the others committed. "
                          "AppendOutcomeUnknown: the group may or may not be in the log (an idempotent producer "
                          "resends it with the same sequence to find out).",
                     models.ProduceResponse),
              Answer(503, "Refused for backpressure or while shutting down: nothing written; retry after "
                          "Retry-After seconds (also retry_after_ms).", models.ProduceResponse, retry_after=True),
              _BAD_BODY, _TOO_LARGE)),
    Route("initProducer", "post", "/producers", "Allocate an idempotent producer id", "produce",
          description="A new producer_id (Kafka's InitProducerId) for idempotent produce requests; its sequences "
                      "start at 0 on every partition. Nothing is stored until it produces. With auth on, the key "
                      "needs a produce permission (on any topic). Served by --role write and both.",
          answers=(Answer(200, "A new producer id.", models.ProducerAllocated),)),
    Route("consume", "post", "/consume", "Fetch records from topic-partitions", "consume",
          request=models.ConsumeRequest,
          example={"topic_partitions": [{"topic": "orders", "partition": 0, "fetch_offset": 1}], "max_wait_ms": 250},
          description="Stateless: the client carries its offsets (next_fetch_offset). Long-polls up to "
                      "max_wait_ms for min_bytes. Every ok result, and an OffsetOutOfRange one, carries the "
                      "partition's log_start_offset (offsets below it were removed by retention); a fetch_offset "
                      "out of range answers OffsetOutOfRange, or with auto_offset_reset earliest or latest reads "
                      "from the log start or the log end instead. Every ok result, and an OffsetOutOfRange one, "
                      "names the topic_id of the topic's incarnation its records and offsets are of: a topic "
                      "deleted and created again has a new topic_id and starts again at offset 1, and records of "
                      "a deleted incarnation are never answered as a later one's. Served by --role read and both.",
          answers=(
              Answer(200, "Each requested topic-partition's records (maybe none), or why not.",
                     models.ConsumeResponse),
              _error(503, "Refused for backpressure or while shutting down; retry after Retry-After seconds.",
                     retry_after=True),
              _BAD_BODY, _TOO_LARGE)),
    Route("commitGroup", "post", "/groups/{group}/commit", "Commit a consumer group's offsets", "groups",
          params=("group",), request=models.GroupCommitRequest,
          example={"offsets": [{"topic": "orders", "partition": 0, "offset": 2}]},
          description="Commits only move forward. Offsets belong to an incarnation of a topic: an offset with "
                      "a topic_id (the consume results' one) is committed to that incarnation only if it is the "
                      "topic's current one, else the whole commit is refused with 409 UnknownTopicId; an offset "
                      "without one goes to the incarnation current when the commit is handled. A topic deleted "
                      "and created again starts with no committed offsets. Served by --role read and both.",
          answers=(
              Answer(200, "Each offset, and whether it moved the group's committed offset.",
                     models.GroupCommitResponse),
              _error(409, "UnknownTopicId: an offset's topic_id is not its topic's current one (the topic was "
                          "deleted, maybe created again, after the offset was read); nothing committed."),
              _BAD_BODY, _TOO_LARGE)),
    Route("describeGroup", "get", "/groups/{group}", "Describe a consumer group: committed offsets and lag", "groups",
          params=("group",), description="Served by --role read and both.", answers=(
              Answer(200, "The group's committed offsets and lag per partition.", models.GroupDescription),
              _BAD_NAME)),
    Route("listTopics", "get", "/topics", "List topics", "topics",
          description="Every topic record. With auth on, only the topics the key may produce to or consume "
                      "from (all with admin).",
          answers=(Answer(200, "Every topic with its partition count, state and effective config.",
                          models.TopicList),)),
    Route("describeTopic", "get", "/topics/{topic}", "Describe a topic and its partitions", "topics",
          params=("topic",),
          description="With auth on, the key needs produce or consume on the topic (or admin).", answers=(
        Answer(200, "The topic's record (partition count, state, effective config) and each initialized "
                    "partition's state, log start offset, high watermark, index entries and bytes.",
               models.TopicDescription),
        _BAD_NAME)),
)

#: Answers every route may give besides its own (404 also covers a role that does not serve it).
_COMMON = (
    _error(404, "No such path, no such method on it, a role that does not serve it, or (/groups, /topics) "
                "no such group or topic."),
    _error(503, "Shutting down, or Oxia or S3 did not answer within their retries; retry after Retry-After "
                "seconds (on another broker).", retry_after=True),
)
_AUTH = (
    _error(401, "Auth is on and the request carries no key, a malformed one or an unknown one."),
    _error(403, "The key may not do this (the error names the key, the action and the first topic not allowed)."),
)

_DESCRIPTION = f"""\
llog's HTTP broker: produce, consume, consumer groups and topics over HTTP, on the leaderless log
(records in S3, offsets and index in Oxia). The produce and consume shapes are the reference
broker's; 401, 403, 413, Retry-After and retry_after_ms are additions.

Auth is off unless {AUTH_ENV_VAR} is set (to a keys file, or inline JSON); a broker listening on a
non-loopback address refuses to start without it unless told --insecure. With auth on, every route
but /health and /openapi.json wants a key, as `Authorization: Bearer <key>` or `X-API-Key: <key>`:
401 (with `WWW-Authenticate: Bearer realm="llog"`) without a known key, 403 when the key's
permissions do not cover the action (produce, consume, groups, admin) on the topics or group
named; /metrics and /metrics/prometheus need admin.
"""


def _version() -> str:
    try:
        return importlib.metadata.version("llog")
    except importlib.metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        return "0.0.0"


def _refine(schema: Any, request_side: bool) -> None:
    """Add the rules the Structs cannot say, in place (see the module docstring)."""
    if isinstance(schema, dict):
        if schema.get("type") == "string" and schema.get("contentEncoding") == "base64":
            schema.setdefault("pattern", BASE64_PATTERN)
        properties = schema.get("properties")
        if request_side and isinstance(properties, dict) and "topic" in properties:
            properties["topic"] = {**properties["topic"], **NAME_SCHEMA}
        for value in schema.values():
            _refine(value, request_side)
    elif isinstance(schema, list):
        for value in schema:
            _refine(value, request_side)


def _refs(schema: Any) -> Iterator[str]:
    """The component names ``schema`` refers to."""
    if isinstance(schema, dict):
        if isinstance(schema.get("$ref"), str):
            yield schema["$ref"].rsplit("/", 1)[1]
        for value in schema.values():
            yield from _refs(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _refs(value)


def _reachable(components: dict[str, Any], roots: list[str]) -> set[str]:
    """``roots`` and every component they refer to, directly or not."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_refs(components[name]))
    return seen


def _media(answer: Answer) -> dict[str, Any]:
    if answer.model is not None:
        return {"schema": {"$ref": REF_TEMPLATE.format(name=answer.model.__name__)}}
    return {"schema": answer.schema}


def _response(answer: Answer) -> dict[str, Any]:
    out: dict[str, Any] = {"description": answer.description, "content": {answer.media_type: _media(answer)}}
    if answer.retry_after:
        out["headers"] = {"Retry-After": {"$ref": "#/components/headers/Retry-After"}}
    if answer.status == 401:
        out["headers"] = {"WWW-Authenticate": {"$ref": "#/components/headers/WWW-Authenticate"}}
    return out


def _operation(route: Route) -> dict[str, Any]:
    answers = {a.status: a for a in _COMMON + (_AUTH if route.secured else ())}
    answers.update({a.status: a for a in route.answers})  # a route's own answer wins (e.g. produce's 503)
    op: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "tags": [route.tag],
        "responses": {str(status): _response(answers[status]) for status in sorted(answers)},
        "security": [{"bearer": []}, {"apiKey": []}] if route.secured else [],
    }
    if route.description:
        op["description"] = route.description
    if route.params:
        op["parameters"] = [{"name": name, "in": "path", "required": True, "schema": dict(NAME_SCHEMA),
                             "example": PARAM_EXAMPLES[name]} for name in route.params]
    if route.request is not None:
        body = _media(Answer(0, "", route.request))
        if route.example is not None:
            msgspec.json.decode(json.dumps(route.example), type=route.request)  # an example the server takes
            body["example"] = route.example
        op["requestBody"] = {"required": True, "content": {JSON: body}}
    return op


def models_in_routes() -> list[type]:
    """Every Struct a route names (requests and responses), in route order."""
    found: list[type] = []
    for route in ROUTES:
        for model in [route.request, *(a.model for a in route.answers + _COMMON + _AUTH)]:
            if model is not None and model not in found:
                found.append(model)
    return found


def document() -> dict[str, Any]:
    """The document as a fresh dict (callers may change it)."""
    return json.loads(document_bytes())


@functools.cache
def document_bytes() -> bytes:
    """The document as JSON (sorted keys, indent 2, trailing newline): what ``GET /openapi.json``
    serves and ``docs/openapi.json`` holds."""
    _, components = msgspec.json.schema_components(models_in_routes(), ref_template=REF_TEMPLATE)
    requests = _reachable(components, [r.request.__name__ for r in ROUTES if r.request is not None])
    for name, schema in components.items():
        _refine(schema, request_side=name in requests)
        schema.update(CROSS_FIELD_RULES.get(name, {}))
    components.update(EXTRA_SCHEMAS)
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        operation = _operation(route)
        paths.setdefault(route.path, {})[route.method] = operation
    doc = {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "info": {"title": "llog broker", "version": _version(), "description": _DESCRIPTION},
        "tags": [{"name": t} for t in dict.fromkeys(r.tag for r in ROUTES)],
        "paths": paths,
        "components": {
            "schemas": components,
            "headers": {
                "Retry-After": {"description": "Whole seconds to wait before retrying.", "required": True,
                                "schema": {"type": "integer", "minimum": 0}},
                "WWW-Authenticate": {"description": 'The auth challenge: Bearer realm="llog".', "required": True,
                                     "schema": {"type": "string"}},
            },
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": f"Authorization: Bearer <key>, a key of {AUTH_ENV_VAR}'s file."},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key",
                           "description": "The same key in X-API-Key."},
            },
        },
    }
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def main() -> int:
    sys.stdout.buffer.write(document_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
