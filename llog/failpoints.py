"""Named crash points for crash-injection tests.

``LLOG_FAILPOINT=<name>`` makes the process kill itself with SIGKILL when it reaches the point
of that name: no cleanup, no flushing, exactly like a machine losing power there. Unset (the
normal case), a failpoint costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

#: Every failpoint, by where it sits (PROTOCOL.md section numbers).
POINTS = {
    "writer.after_blob_put": "section 4.2 done: the WAL blob exists, nothing in Oxia yet",
    "writer.after_reserve": "section 4.3 done: offsets reserved, pending set, no index entry",
    "writer.after_index_put": "section 4.4 done: index entry written, pending not cleared",
    "sink.before_commit": "a Spark batch's blobs are staged, its driver-side commit not begun",
    "sink.after_commit": "a Spark batch is committed to the log, Spark has not recorded it",
    "writer.after_staged_slice": "commit_staged has committed one slice, others perhaps not yet",
}


def hit(name: str) -> None:
    """Kill this process at point ``name`` if ``LLOG_FAILPOINT`` names it. With
    ``LLOG_FAILPOINT_SCOPE=session`` the process group of this session's leader dies first: a
    Spark driver started as a session leader takes its JVM with it, whichever Python worker
    (a task's or the commit's) reaches the point, as when the driver's machine goes down."""
    if os.environ.get("LLOG_FAILPOINT") == name:
        if os.environ.get("LLOG_FAILPOINT_SCOPE") == "session":
            os.killpg(os.getsid(0), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
