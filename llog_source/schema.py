"""The columns every llog read returns: Kafka's source schema without key and headers."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

SOURCE_SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("value", BinaryType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
])

#: What Spark expects back for :data:`SOURCE_SCHEMA`: its Arrow form, with UTC microsecond
#: timestamps and every field nullable as Spark declares it.
ARROW_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("value", pa.binary()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
])

#: ``timestampType``: the timestamp is when the log accepted the record (Kafka's LogAppendTime).
LOG_APPEND_TIME = 1
