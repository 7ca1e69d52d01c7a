"""Named points for crash-injection and interleaving tests.

``LLOG_FAILPOINT=<name>`` makes the process kill itself with SIGKILL when it reaches the point
of that name: no cleanup, no flushing, exactly like a machine losing power there.

``hooks[name] = fn`` (in-process, for tests) calls ``fn()`` when the point is reached, before
the SIGKILL check: one actor "pauses" there while the hook runs other actors to completion, so
an interleaving that needs a stall is reproduced deterministically, with no threads. A hook may
raise to abort the actor at that point.

Unset (the normal case), a point costs two dictionary lookups.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

#: Every failpoint, by where it sits (docs/protocol.md section numbers).
POINTS = {
    "writer.after_blob_put": "section 4.2 done: the WAL blob exists, nothing in Oxia yet",
    "writer.after_reserve": "section 4.3 done: offsets reserved, pending set, no index entry",
    "writer.after_index_put": "section 4.4 done: index entry written, pending not cleared",
    "sink.before_commit": "a Spark batch's blobs are staged, its driver-side commit not begun",
    "sink.after_commit": "a Spark batch is committed to the log, Spark has not recorded it",
    "writer.after_staged_slice": "commit_staged has committed one slice, others perhaps not yet",
    "coordination.after_write": "a Write RPC was answered, its results not yet read (a hook that raises loses the reply)",
    "writer.before_reserve_cas": "section 4.3: control read, blob age not yet checked, reserving CAS not sent",
    "control.before_materialize": "section 4.4: a materializer holds a pending, its budget not yet checked",
    "control.before_clear": "section 4.5: the index entry exists, the CAS that clears pending not yet sent",
    "writer.after_clear": "section 4.5 done: the writer cleared its pending, the tripwire's check perhaps not done",
    "control.before_tripwire": "section 8.4: index entries were created, the compaction cursors not yet read",
    "compactor.after_recover": "section 6.0 done: pending finished, in-flight record resumed, no run selected",
    "compactor.after_select": "section 6.1 done: a run is selected, its blob not yet written",
    "compactor.after_age_check": "section 6.2 done: the compacted blob is written and was young enough once",
    "sink_batches.before_finish_cas": "section 9.1: an operator's finish read the pin, its CAS not yet sent",
    "sink_batches.before_unpin_cas": "section 9.1: an operator's unpin --committed read the pin and progress, its CAS not yet sent",
    "gc.before_control_read": "section 9.2 step 2 done: partitions found, their meta/control not yet read",
    "gc.before_index_scan": "section 9.2 step 3: meta/control and meta/compaction read, indexes not yet scanned",
    "gc.after_scan": "section 9: references scanned, blobs not yet listed",
    "retention.before_control_update": "section 10.3: a retention pass chose its new log start, meta/control not yet changed",
    "reader.before_fetch": "section 5.4: a read's entries are resolved, their blobs not yet fetched",
    "topics.before_update_cas": "section 10.2: an alter or a growth read the topic record, its CAS not yet sent",
    "kafka_registry.before_refresh_scan": "section 9.5: a listener's refresh is about to scan the registry (a hook that raises makes that scan fail)",
}

#: In-process hooks by point name (tests only); see the module doc.
hooks: dict[str, Callable[[], None]] = {}


def hit(name: str) -> None:
    """Kill this process at point ``name`` if ``LLOG_FAILPOINT`` names it. With
    ``LLOG_FAILPOINT_SCOPE=session`` the process group of this session's leader dies first: a
    Spark driver started as a session leader takes its JVM with it, whichever Python worker
    (a task's or the commit's) reaches the point, as when the driver's machine goes down.
    A hook registered in :data:`hooks` for ``name`` runs first."""
    hook = hooks.get(name)
    if hook is not None:
        hook()
    if os.environ.get("LLOG_FAILPOINT") == name:
        if os.environ.get("LLOG_FAILPOINT_SCOPE") == "session":
            os.killpg(os.getsid(0), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
