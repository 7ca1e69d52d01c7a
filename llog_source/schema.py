"""The columns every llog read returns: Spark's Kafka source schema, in Kafka's order, with
``headers`` when ``includeHeaders`` is true (Kafka's option)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType,
)

HEADERS_FIELD = StructField("headers", ArrayType(StructType([
    StructField("key", StringType()), StructField("value", BinaryType())])))

SOURCE_SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
])
SOURCE_SCHEMA_WITH_HEADERS = StructType(SOURCE_SCHEMA.fields + [HEADERS_FIELD])

#: What Spark expects back for :data:`SOURCE_SCHEMA`: its Arrow form, with UTC microsecond
#: timestamps and every field nullable as Spark declares it.
ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
])
ARROW_HEADERS_TYPE = pa.list_(pa.field("element", pa.struct([pa.field("key", pa.string()),
                                                             pa.field("value", pa.binary())])))
ARROW_SCHEMA_WITH_HEADERS = ARROW_SCHEMA.append(pa.field("headers", ARROW_HEADERS_TYPE))

#: ``timestampType``: the timestamp is the producer's event time (Kafka's CreateTime).
CREATE_TIME = 0
#: ``timestampType``: the timestamp is when the log accepted the record (Kafka's LogAppendTime).
LOG_APPEND_TIME = 1


def source_schema(include_headers: bool) -> StructType:
    return SOURCE_SCHEMA_WITH_HEADERS if include_headers else SOURCE_SCHEMA
