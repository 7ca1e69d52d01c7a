"""The broker's request and response bodies, as msgspec Structs: the one definition that decodes
and validates requests and encodes responses (the seed's HTTP contract,
``shared/reference/HTTP_API.txt``). A body that does not match gets a 400 naming the field.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

#: A topic as the request shape checks it; llog's topic rule (PROTOCOL.md section 1) is checked
#: when the request is admitted, also with a 400.
Topic = Annotated[str, msgspec.Meta(min_length=1)]
Partition = Annotated[int, msgspec.Meta(ge=0)]


class Base64Record(msgspec.Struct, forbid_unknown_fields=True):
    """A record given as base64 (raw bytes); a plain JSON string is a record of its UTF-8 bytes."""

    base64: bytes


class ProduceGroup(msgspec.Struct, forbid_unknown_fields=True):
    topic: Topic
    partition: Partition
    records: Annotated[list[str | Base64Record], msgspec.Meta(min_length=1)]


class ProduceRequest(msgspec.Struct, forbid_unknown_fields=True):
    topic_partitions: Annotated[list[ProduceGroup], msgspec.Meta(min_length=1)]


class ProduceResult(msgspec.Struct, omit_defaults=True):
    """One topic-partition group of a request: where it landed (``ok``), or why not."""

    topic: str
    partition: int
    ok: bool
    start_offset: int | None = None
    end_offset: int | None = None
    count: int | None = None
    index_key: str | None = None
    wal_uri: str | None = None
    error_type: str | None = None
    error: str | None = None


class ProduceResponse(msgspec.Struct, omit_defaults=True):
    results: list[ProduceResult]
    success_count: int
    error_count: int
    #: With 503: when to try again (also the ``Retry-After`` header, in whole seconds).
    retry_after_ms: int | None = None


class Health(msgspec.Struct):
    status: str
    broker_id: str
    host: str
    port: int
    started_at_ms: int


class ErrorBody(msgspec.Struct):
    """A request refused as a whole (400, 404, 413)."""

    error_type: str
    error: str
