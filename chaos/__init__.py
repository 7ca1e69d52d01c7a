"""The chaos run: ``python -m chaos`` (``make chaos``).

Writers, compactors, a GC loop and readers, each its own process, work on one topic of a real
local stack (Oxia + versitygw) for a set time, with the grace period ``G`` small so that pauses
matter, while the controller, from a seed, pauses processes with SIGSTOP (up to a few seconds
past the materialization budget ``G/4`` and the compactors' Oxia session), kills them with
SIGKILL and starts them again, and restarts Oxia and the S3 server once each. Every writer records
each append it was acknowledged, after the acknowledgement.

At the end it finishes what a killed writer left pending, runs a last GC pass (it must
succeed), reads every partition back and checks that every acknowledged record is at its
offset with its bytes (``lost``), that no record is in the log twice (``duplicated``), and the
invariants of docs/protocol.md section 8 (``invariant_violations``, with what the readers and GC
saw during the run). One JSON line on stdout; exit 0 only if all three are zero.

A failure replays with the seed it printed: ``python -m chaos --seed N`` (the timing of the
processes themselves still varies).
"""
