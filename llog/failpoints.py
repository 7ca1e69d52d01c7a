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
}


def hit(name: str) -> None:
    if os.environ.get("LLOG_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
