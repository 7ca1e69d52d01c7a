"""The local stack's rooms, one per thing it runs or keeps; :mod:`llog_tools.local_stack` runs them
together (``up``, ``down``, ``status``, one service's kill, start, pause and resume):

- :mod:`~llog_tools.stack.build`: the Oxia and S3 server binaries, built from the Go module proxy and patched
- :mod:`~llog_tools.stack.oxia_server`: Oxia, standalone or a replicated cluster
- :mod:`~llog_tools.stack.s3_server`: the S3 server, versitygw
- :mod:`~llog_tools.stack.brokers`: the HTTP brokers and their Kafka listeners
- :mod:`~llog_tools.stack.haproxy`: the balancer in front of several brokers
- :mod:`~llog_tools.stack.network`: the stack's address, its ports and HTTP probes
- :mod:`~llog_tools.stack.state`: the stack's directory and its record, ``stack.json``
- :mod:`~llog_tools.stack.processes`: starting, checking and stopping processes; the lock
- :mod:`~llog_tools.stack.command`: the ``llog stack`` command line
"""
