"""llog: the Leaderless Log Protocol on Oxia and S3 (see PROTOCOL.md).

The protocol core shared by the Spark sink and source, the compaction job and the broker.
It never imports Spark.
"""

import os

# grpcio >= 1.81 restarts its event engine's poller in a child between fork and exec; when
# subprocess closes the child's file descriptors that thread aborts the child (SIGABRT) before
# exec, about 1 fork in 100 while channels are busy (grpc/grpc#43055, open). Spark launches its
# JVM with fork + exec, and so does every Popen with a preexec_fn: a Spark session started in a
# process that talks to Oxia failed with JAVA_GATEWAY_EXITED. Explicitly off, the child runs no
# gRPC handler (0 of 1,000 forks failed, against 8 of 600 with the default). Set before gRPC
# starts, here since every module that imports it is in this package; a value the user set wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from llog.config import Config  # noqa: E402
from llog.reader import LogReader, ReadRequest, Record, RECORD_SCHEMA  # noqa: E402
from llog.writer import AppendGroup, AppendResult, LogWriter  # noqa: E402

__all__ = ["Config", "LogReader", "LogWriter", "AppendGroup", "AppendResult", "ReadRequest", "Record", "RECORD_SCHEMA"]
