"""llog_tools: the tools around the protocol, not the protocol: the ``llog`` command
(``python -m llog_tools``), the local stack (Oxia, the S3 server, brokers), the reports of
``llog describe`` and ``llog topics describe`` with their S3 prices, progress bars, and the local
observability stack (``llog observe``).

It imports the core, :mod:`llog`; the core, the connectors, the broker and the compaction job
never import it (tests/unit/test_import_layers.py).
"""

# The core first: its package turns gRPC's fork handling off before gRPC loads (llog/__init__.py
# says why), and the local stack imports grpc itself.
import llog  # noqa: F401
