"""llog: the Leaderless Log Protocol on Oxia and S3 (see docs/protocol.md).

The protocol core shared by the Spark sink and source, the compaction job, the broker and the
tools around them (:mod:`llog_tools`: the ``llog`` command, the local stack). It never imports
Spark, nor the tools.
"""

import os

# grpcio >= 1.81 restarts its event engine's poller in a child between fork and exec; when
# subprocess closes the child's file descriptors that thread aborts the child (SIGABRT) before
# exec, about 1 fork in 100 while channels are busy (grpc/grpc#43055, open). Spark launches its
# JVM with fork + exec, and so does every Popen with a preexec_fn: a Spark session started in a
# process that talks to Oxia failed with JAVA_GATEWAY_EXITED. Explicitly off, the child runs no
# gRPC handler (0 of 1,000 forks failed, against 8 of 600 with the default). Set before gRPC
# starts, here since every module that imports it is in this package or imports it first
# (llog_tools/__init__.py); a value the user set wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

#: The public API, by where it lives. Imported on first use (PEP 562), so that a process that
#: needs one module of the core (a Spark planner parsing options, a worker reading) does not pay
#: for all of it: ``from llog import LogWriter`` works as ever.
_EXPORTS = {
    "Config": "llog.config",
    "LogReader": "llog.reader", "ReadRequest": "llog.reader", "Record": "llog.reader", "RECORD_SCHEMA": "llog.reader",
    "LogWriter": "llog.writer", "AppendGroup": "llog.writer", "AppendResult": "llog.writer",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'llog' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
