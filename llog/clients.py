"""What the writer, reader and compactor share: the Oxia and S3 clients they use, a thread pool and
the clock their time checks read (:mod:`llog.clock`)."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from llog.clock import SYSTEM, Clock
from llog.config import Config
from llog.coordination import Coordination
from llog.deployment import check_clock, pass_gate
from llog.errors import LlogError
from llog.keys import PartitionKeys
from llog.objects import ObjectStore
from llog.topics import TopicCache

log = logging.getLogger(__name__)


class ClientUser:
    """Uses the given clients, or creates its own; ``close`` closes only the ones it created."""

    def __init__(self, config: Config, coordination: Coordination | None, objects: ObjectStore | None,
                 max_workers: int, thread_name_prefix: str, clock: Clock | None = None):
        self.config = config
        self.clock = clock or SYSTEM
        self.coordination = coordination or Coordination(config)
        self.objects = objects or ObjectStore(config)
        self._owned = [c for c, given in ((self.coordination, coordination), (self.objects, objects)) if given is None]
        #: The topic records this user resolves incarnations with (section 12); a writer sets one
        #: that creates topics.
        self.topics = TopicCache(self.coordination, self.config, self.clock, auto_create=False)
        self._clock_warned = False
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=thread_name_prefix)

    @classmethod
    def from_env(cls, **kwargs):
        """Built from the environment (or the local stack's settings file)."""
        return cls(Config.load(), **kwargs)

    def check_deployment(self, who: str) -> None:
        """The deployment gate, under this user's name, before it first writes, compacts or
        collects: the root prefix's one ``G`` and this machine's clock against the S3 server's,
        once per process and config (:func:`llog.deployment.pass_gate`; its clients' first write
        would pass it anyway, docs/protocol.md section 9.2)."""
        pass_gate(self.config, self.coordination, self.objects, who)

    def warn_clock_once(self) -> None:
        """Once per instance, for a reader: a warning when this machine's clock is far from the S3
        server's (:func:`llog.deployment.check_clock`); a read never fails for it."""
        if self._clock_warned:
            return
        self._clock_warned = True
        try:
            check_clock(self.objects, self.config, SYSTEM, refuse=False)
        except LlogError as e:  # the server's time could not be had: the read itself will say more
            log.debug("clock check skipped: %s", e)

    def keys(self, topic: str, partition: int, fresh: bool = False) -> PartitionKeys:
        """The keys of ``topic[partition]`` in the topic's current incarnation (:class:`TopicNotFound`
        without a record; ``fresh``: read the record again first)."""
        return self.topics.keys(topic, partition, fresh)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for client in self._owned:
            client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
