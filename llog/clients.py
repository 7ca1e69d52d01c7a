"""What the writer, reader and compactor share: the Oxia and S3 clients they use, a thread pool and
the clock their time checks read (:mod:`llog.clock`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from llog.clock import SYSTEM, Clock
from llog.config import Config
from llog.coordination import Coordination
from llog.keys import PartitionKeys, TopicPartition
from llog.objects import ObjectStore


class ClientUser:
    """Uses the given clients, or creates its own; ``close`` closes only the ones it created."""

    def __init__(self, config: Config, coordination: Coordination | None, objects: ObjectStore | None,
                 max_workers: int, thread_name_prefix: str, clock: Clock | None = None):
        self.config = config
        self.clock = clock or SYSTEM
        self.coordination = coordination or Coordination(config)
        self.objects = objects or ObjectStore(config)
        self._owned = [c for c, given in ((self.coordination, coordination), (self.objects, objects)) if given is None]
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=thread_name_prefix)

    @classmethod
    def from_env(cls, **kwargs):
        """Built from the environment (or the local stack's settings file)."""
        return cls(Config.load(), **kwargs)

    def keys(self, topic: str, partition: int) -> PartitionKeys:
        return PartitionKeys(self.config.root_prefix, TopicPartition(topic, partition))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for client in self._owned:
            client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
