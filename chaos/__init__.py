"""The chaos run: ``python -m chaos`` (``make chaos``).

Writers, compactors, a GC loop and readers, each its own process, work on one topic of a real
local stack (Oxia + versitygw) for a set time, with the grace period ``G`` small so that pauses
matter, while the controller, from a seed, pauses processes with SIGSTOP (up to a few seconds
past the materialization budget ``G/4`` and the compactors' Oxia session), kills them with
SIGKILL and starts them again, and restarts Oxia and the S3 server once each. Every writer records
each append it was acknowledged, after the acknowledgement.

A kill waits up to 2 s for its actor to be mid-operation, by the actor's own activity file (a
kill between operations tests little); the first kills go to a writer and a compactor, until one
of each was killed mid-operation.

At the end, once every actor has stopped, it finishes what the next actor would (per partition,
a compactor's recovery step: a pending append materialized, a ``meta/compaction`` record resumed
to completion), checks the invariants of docs/protocol.md section 8 at rest, runs a last GC pass with
its clock ``G`` and a margin ahead (it must succeed, and delete no blob still referenced), reads
every partition back and checks that every acknowledged record is at its offset with its bytes
(``lost``), that no offset was acknowledged twice (``double_acked``), that no record is in the
log twice (``duplicated``), and counts what broke the invariants (``invariant_violations``, with
what the readers and GC saw during the run). One JSON line on stdout, with what the run did by
the actors' own accounts (``records_acked``, ``compactions_completed``, ``gc_deleted_blobs``,
``kills`` and ``killed_mid_operation`` by role); exit 0 only if nothing was lost, double
acknowledged, duplicated or broken, and the run did what its checks need (``not_exercised``
lists what it did not: nothing acknowledged, no compaction completed, GC deleted nothing, no
writer or no compactor killed mid-operation; a run much shorter than ``3 G`` may not reach GC).

A failure replays with the seed it printed: ``python -m chaos --seed N`` (the timing of the
processes themselves still varies).
"""
