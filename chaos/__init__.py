"""The chaos run: ``python -m chaos`` (``make chaos``).

Writers, compactors (a share of their passes also retention passes), a GC loop, readers, a topic
admin, consumers committing group offsets, and two brokers (``python -m broker_lite``) behind
HAProxy (as ``llog stack up --brokers 2`` runs them: a partition's requests go to one broker, to
the other while that one is paused or killed) with producers (idempotent and plain) and a
consumer through it, a confluent-kafka idempotent producer and a Kafka consumer group of two
members through the brokers' Kafka listeners, each its own process, work on a real local
stack (its S3 server, and Oxia as a replicated cluster: a coordinator and 3 servers, 3 shards,
replication factor 3; ``--oxia-standalone``: one server of the run's own with 3 shards) for a set
time, with the grace period ``G`` small so that pauses matter. Three topics: the main one, one
the admin deletes and creates again every few seconds while writers append to it (a writer
whose append meets the tombstone moves it to the current incarnation; each ack records the
``topic_id`` it landed in), both with ``retention.ms`` 80% of the run (at least a little above
``G``: retention takes what the first 20% wrote, and leaves the rest to check), and one no one
creates: writers create it on first use and grow it, racing, by writing to ever higher
partitions, up to twice ``--partitions`` (docs/protocol.md section 10.2; at the end it must be
marked created on first use, have grown past ``--partitions`` and no further than a write named:
``grown_partitions``). Writers and
compactors lose the reply of an Oxia Write now and then, after the server applied it (failpoint
``coordination.after_write``). The controller, from a seed, pauses processes with SIGSTOP (up to
a few seconds past the materialization budget ``G/4`` and the compactors' Oxia session), kills
them with SIGKILL and starts them again (the brokers too, and among them, until it was killed
once, the one whose listener coordinates the Kafka group), and restarts Oxia and the S3 server
once each (in a cluster, the Oxia server leading the most shards is SIGKILLed under load and
started again with its data). Every producer records each append it was acknowledged (a 200 with
offsets, through the broker), after the acknowledgement, with the time it first sent the append
(before its blob, so before its index entry's ``created_at_ms``). The admin records each
incarnation it deletes, before the delete.

A kill waits up to 2 s for its actor to be mid-operation, by the actor's own activity file (a
kill between operations tests little); a compactor, up to 6 s for a step between its
``meta/compaction`` record's create and its cursor's move (a kill in a pass with nothing to
compact leaves nothing to recover); the first kills go to a writer and a compactor, until one
of each was killed so.

At the end, once every actor has stopped, it finishes what the next actor would (a delete the
admin was killed in; per partition, a compactor's recovery step: a pending append materialized, a
``meta/compaction`` record resumed to completion), checks the invariants of docs/protocol.md
section 8 at rest, runs a last GC pass with its clock ``G`` and a margin ahead (it must succeed,
and delete no blob still referenced), reads every partition of each live incarnation back from its
log start and checks, per incarnation ``(topic, topic_id, partition)`` (:func:`chaos.run.judge_acks`):
that every acknowledged record at or above the log start is at its offset with its bytes
(``verified`` counts them); below the log start a record is ``gone_by_retention`` only if its
append was sent more than ``max(retention.ms, G)`` (the retention floor, section 10.3) before the
actors stopped, and the records of a partition not read back are ``gone_with_deleted_topic`` only
if the admin named its incarnation and its ``meta/control`` is the tombstone (section 12.4); every
other acknowledged record not read back is ``lost``. It checks that no offset was acknowledged
twice (``double_acked``), that no record is in the log twice (``duplicated``), and that no record
was read, during the run or now, in an incarnation other than the one its acknowledgement names
(``mixed_incarnations``; not acknowledged: read in two). It counts what broke the invariants
(``invariant_violations``, with what the readers, compactors (``InconsistentReadState``) and GC
saw during the run, and a consumer group's committed offset seen moving back). An ack line cut by
a kill at the end of its file is counted (``acks_cut``), not judged.

The Kafka consumer group (``kafka_consumer`` members ``kc0``, ``kc1``: classic protocol,
``subscribe()``, each ``consume()`` followed by one synchronous commit; what each consumed and
committed, and what the commit answered, in ``kafka_group/``) is judged by
:func:`chaos.run.judge_kafka_group`: every record a member consumed is the log's at that offset
(``kafka_wrong_records``), a partition's offsets increase within a member's assignment
(``kafka_out_of_order``) with none skipped that the log still has (``kafka_skipped``), a member
begins an assignment no later than the group's commits allow (``kafka_started_past_commit``), and the
group's committed offset per partition (llog's consumer-group record) ends at or above the highest
commit acknowledged, ``H``, except where a member assigned the partition after ``H`` was sent
committed the lower offset (a newer generation that read the offset before ``H`` landed: Kafka
allows it, ``kafka_commits_moved_back``); else ``kafka_lost_commits``. The run must show the group
consumed, had commits acknowledged, had its coordinator killed (``kafka_coordinator_kills``),
got assignments again after that (``kafka_assignments_after_coordinator_kill``) and consumed
(``kafka_consumed_after_coordinator_kill``). One JSON line on
stdout, with what the run did by the actors' own accounts (``records_acked``,
``compactions_completed``, ``gc_deleted_blobs``, ``topic_recreations``, ``retention_passes``
(passes that moved a log start; while there was none yet, the chaos goes on past ``--seconds``,
up to 20 s, until one has), ``group_commits``, ``lost_responses``, ``broker_kills``,
``kills`` and ``killed_mid_operation`` by role, ``compactions_resumed``, ``exits``); exit 0 only
if nothing was lost, double acknowledged, duplicated, mixed or broken, the run did what its
checks need (``not_exercised`` lists what it did not: any of those counters 0, nothing
acknowledged to the broker's idempotent producer, to its plain one, or committed through it, the
Kafka group's counts above, no writer killed mid-operation, no compactor killed between
compaction steps, no compaction record resumed, records acknowledged in fewer than 2
incarnations of the re-created topic; a run much shorter than ``3 G`` may not reach GC or
retention), and it kept its bounds (``out_of_bounds``: ``verified_fraction``, the share of what
was acknowledged read back and checked, at least 0.5; every exit of an actor by itself within
35 s after a server restart, and at most one per actor per restart: an actor exits only when a
server it needs is away).

A failure replays with the seed it printed: ``python -m chaos --seed N`` (the timing of the
processes themselves still varies); ``--keep DIR`` keeps the run's directory (logs, acks,
activity, the Kafka group's events) to look at.
"""
