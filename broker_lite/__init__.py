"""The HTTP broker for producers and consumers that don't run Spark (issue 12), built on the core
in :mod:`llog`. So far: the group commit (:mod:`broker_lite.batcher`)."""
