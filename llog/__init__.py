"""llog: the Leaderless Log Protocol on Oxia and S3 (see PROTOCOL.md).

The protocol core shared by the Spark sink and source, the compaction job and the broker.
It never imports Spark.
"""

from llog.config import Config
from llog.reader import LogReader, ReadRequest, Record, RECORD_SCHEMA
from llog.writer import AppendGroup, AppendResult, LogWriter

__all__ = ["Config", "LogReader", "LogWriter", "AppendGroup", "AppendResult", "ReadRequest", "Record", "RECORD_SCHEMA"]
