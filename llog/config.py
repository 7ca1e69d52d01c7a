"""Configuration: one immutable :class:`Config`, built from options, environment and settings files.

Where a value comes from, first match wins:

1. ``options`` passed by the caller (the Spark connectors pass their ``llog.*`` options),
2. ``LLOG_*`` environment variables,
3. the TOML file ``$LLOG_CONFIG_FILE`` names, if set (a deployment's settings; keys are the
   ``LLOG_*`` names; ``conf/llog.example.toml`` lists them all: :func:`example_toml`),
4. the local stack's settings file (``llog stack up`` writes it; see :func:`settings_file`),
5. ``AWS_*`` fallbacks for S3 credentials and region,
6. the defaults below.

Option keys may be the environment name (``LLOG_S3_BUCKET``) or ``llog.`` plus the field name
with dots or underscores (``llog.s3.bucket``, ``llog.s3_bucket``). In every layer an empty value
counts as unset.

``python -m llog.config example`` prints the example TOML file (every setting, its default and
meaning, taken from the ``#:`` comments of :class:`Config`); ``python -m llog.config docs-table
--write docs/configuration.md`` puts the same as a table into the documentation site's page.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import math
import os
import re
import sys
import textwrap
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llog.errors import ConfigError

#: Environment names of every field, in the reference implementation's vocabulary.
ENV_NAMES: dict[str, str] = {
    "oxia_service_address": "LLOG_OXIA_SERVICE_ADDRESS",
    "oxia_namespace": "LLOG_OXIA_NAMESPACE",
    "root_prefix": "LLOG_ROOT_PREFIX",
    "oxia_session_timeout_ms": "LLOG_OXIA_SESSION_TIMEOUT_MS",
    "oxia_request_timeout_ms": "LLOG_OXIA_REQUEST_TIMEOUT_MS",
    "client_identifier": "LLOG_CLIENT_IDENTIFIER",
    "s3_bucket": "LLOG_S3_BUCKET",
    "s3_endpoint_url": "LLOG_S3_ENDPOINT_URL",
    "s3_region_name": "LLOG_S3_REGION_NAME",
    "s3_access_key_id": "LLOG_S3_ACCESS_KEY_ID",
    "s3_secret_access_key": "LLOG_S3_SECRET_ACCESS_KEY",
    "s3_session_token": "LLOG_S3_SESSION_TOKEN",
    "s3_max_attempts": "LLOG_S3_MAX_ATTEMPTS",
    "s3_timeout_s": "LLOG_S3_TIMEOUT_S",
    "batch_max_bytes": "LLOG_BATCH_MAX_BYTES",
    "batch_max_delay_ms": "LLOG_BATCH_MAX_DELAY_MS",
    "batch_max_buffer_bytes": "LLOG_BATCH_MAX_BUFFER_BYTES",
    "broker_max_request_bytes": "LLOG_BROKER_MAX_REQUEST_BYTES",
    "broker_role": "LLOG_BROKER_ROLE",
    "broker_max_wait_ms": "LLOG_BROKER_MAX_WAIT_MS",
    "broker_auth": "LLOG_BROKER_AUTH",
    "tail_cache_max_bytes": "LLOG_TAIL_CACHE_MAX_BYTES",
    "tail_cache_dir": "LLOG_TAIL_CACHE_DIR",
    "metrics_scan_interval_s": "LLOG_METRICS_SCAN_INTERVAL_S",
    "metrics_textfile_dir": "LLOG_METRICS_TEXTFILE_DIR",
    "cas_max_attempts": "LLOG_CAS_MAX_ATTEMPTS",
    "gc_grace_ms": "LLOG_GC_GRACE_MS",
    "sink_progress_retention_ms": "LLOG_SINK_PROGRESS_RETENTION_MS",
    "max_record_bytes": "LLOG_MAX_RECORD_BYTES",
    "compression_type": "LLOG_COMPRESSION_TYPE",
    "topic_config": "LLOG_TOPIC_CONFIG",
    "auto_create_topics": "LLOG_AUTO_CREATE_TOPICS",
    "default_partitions": "LLOG_DEFAULT_PARTITIONS",
    "max_auto_partitions": "LLOG_MAX_AUTO_PARTITIONS",
    "retention_ms": "LLOG_RETENTION_MS",
    "retention_bytes": "LLOG_RETENTION_BYTES",
}

#: The environment variable naming a TOML settings file (module doc, layer 3).
CONFIG_FILE_ENV = "LLOG_CONFIG_FILE"

#: AWS's own names, used when neither options, LLOG_* nor the settings files set a value.
AWS_FALLBACKS: dict[str, tuple[str, ...]] = {
    "s3_region_name": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "s3_access_key_id": ("AWS_ACCESS_KEY_ID",),
    "s3_secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "s3_session_token": ("AWS_SESSION_TOKEN",),
}

#: Compressions of record bodies (docs/protocol.md section 11), Kafka's ``compression.type`` values.
COMPRESSION_TYPES = ("none", "lz4", "zstd")
#: Per-topic settings ``LLOG_TOPIC_CONFIG`` may hold, by Kafka's name, and their values.
TOPIC_SETTINGS: dict[str, tuple[str, ...]] = {"compression.type": COMPRESSION_TYPES}

#: Session timeouts the Oxia server accepts.
SESSION_TIMEOUT_RANGE_MS = (2_000, 300_000)

_SECRET_FIELDS = {"s3_secret_access_key", "s3_session_token"}


def llog_home() -> Path:
    """Where llog keeps installed binaries and the local stack: ``$LLOG_HOME``, else the
    ``.cache`` directory of the source checkout llog runs from, else ``~/.llog``."""
    if os.environ.get("LLOG_HOME"):
        return Path(os.environ["LLOG_HOME"]).expanduser().resolve()
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "setup.py").is_file() and (checkout / "llog").is_dir():
        return checkout / ".cache"
    return Path.home() / ".llog"


def stack_dir() -> Path:
    """State of the local stack (data, logs, pids, settings): ``$LLOG_STACK_DIR`` or
    ``<llog_home>/stack``."""
    if os.environ.get("LLOG_STACK_DIR"):
        return Path(os.environ["LLOG_STACK_DIR"]).expanduser().resolve()
    return llog_home() / "stack"


def settings_file() -> Path:
    """The settings file ``llog stack up`` writes: ``$LLOG_SETTINGS_FILE`` or
    ``<stack_dir>/settings.json``. A JSON object of ``LLOG_*`` names to values."""
    if os.environ.get("LLOG_SETTINGS_FILE"):
        return Path(os.environ["LLOG_SETTINGS_FILE"]).expanduser().resolve()
    return stack_dir() / "settings.json"


@dataclass(frozen=True)
class Config:
    """Connection and tuning settings shared by every llog component."""

    #: Oxia's service address, ``host:port`` (every component that reads or writes a log needs it).
    oxia_service_address: str | None = None
    #: The Oxia namespace that holds llog's keys.
    oxia_namespace: str = "default"
    #: Prefix of llog's keys in Oxia and of its objects in the bucket, so several deployments can
    #: share both; no leading or trailing ``/``.
    root_prefix: str = "llog"
    #: Timeout of a client's Oxia session (2000..300000), which holds its ephemeral claims: they
    #: vanish this long after the client stops heartbeating (it crashed, say).
    oxia_session_timeout_ms: int = 30_000
    #: Deadline of one Oxia request; the client library has none of its own.
    oxia_request_timeout_ms: int = 10_000
    #: How this process names itself in its Oxia sessions and in compactor ids; unset: the Oxia
    #: client picks a name, and compactors use the host name.
    client_identifier: str | None = None
    #: The bucket of WAL blobs and compacted objects (every component that reads or writes a log
    #: needs it); it must exist.
    s3_bucket: str | None = None
    #: The S3 endpoint, e.g. ``http://127.0.0.1:18333`` for the local stack's versitygw; unset: AWS
    #: S3 in the region below.
    s3_endpoint_url: str | None = None
    #: The bucket's region (also the one whose S3 prices ``llog topics describe`` uses).
    s3_region_name: str = "us-east-1"
    #: S3 credentials; if neither this nor its AWS fallback is set: boto3's own chain (an
    #: instance or task role, ``~/.aws``, ...).
    s3_access_key_id: str | None = None
    #: The secret of the access key above.
    s3_secret_access_key: str | None = field(default=None, repr=False)
    #: The session token of temporary credentials.
    s3_session_token: str | None = field(default=None, repr=False)
    #: Attempts per S3 request (botocore's standard retry mode).
    s3_max_attempts: int = 5
    #: Connect and read timeout of one S3 request, seconds.
    s3_timeout_s: float = 60.0
    #: Size at which writers split shared WAL blobs.
    batch_max_bytes: int = 8 * 1024 * 1024
    #: A group commit (the HTTP broker): after this long an open batch may start in a second flush
    #: slot beside a running flush on other partitions; it is sealed at once when no flush runs (so a
    #: lone producer never waits it out), and when the running one ends.
    batch_max_delay_ms: int = 5
    #: Bytes of records a group commit holds uncommitted (open, sealed and in flight); a request
    #: past it is refused with backpressure (503) instead of queueing without bound.
    batch_max_buffer_bytes: int = 64 * 1024 * 1024
    #: The HTTP broker refuses a request body larger than this (or than the buffer above) with
    #: 413, before reading it.
    broker_max_request_bytes: int = 8 * 1024 * 1024
    #: What the HTTP broker serves: ``write`` (produce), ``read`` (consume and groups), ``both``.
    broker_role: str = "both"
    #: The longest a consume long-polls, whatever its ``max_wait_ms`` asks.
    broker_max_wait_ms: int = 30_000
    #: The HTTP broker's API keys: a JSON file's path, or the JSON itself (docs/broker.md, "Roles
    #: and auth"). Unset: no auth, and the broker listens on loopback only.
    broker_auth: str | None = field(default=None, repr=False)
    #: Bytes of recently produced records the HTTP broker keeps to answer consumers at the tail
    #: without Oxia or S3; 0 turns the cache off.
    tail_cache_max_bytes: int = 512 * 1024 * 1024
    #: A directory where brokers on one machine share their tail cache (writers put runs there,
    #: readers find them); unset: each broker's cache is its own, in memory.
    tail_cache_dir: str | None = None
    #: The HTTP broker scans the bucket's size and the consumer groups' lag this often (seconds).
    metrics_scan_interval_s: float = 60.0
    #: The compaction job and ``llog gc`` write their run's metrics here (``compaction.prom``,
    #: ``gc.prom``, node_exporter's textfile format); unset: nowhere.
    metrics_textfile_dir: str | None = None
    #: Attempts of one CAS loop on a contended ``meta/control`` before giving up.
    cas_max_attempts: int = 64
    #: ``G``: WAL blobs unreferenced and older than this may be garbage collected (docs/protocol.md
    #: section 9); so nothing commits a reference to a blob older than ``G/2``, index entries are
    #: created within ``G/4`` of the request that showed their pending, and compaction takes only
    #: entries older than ``G`` (docs/protocol.md sections 4 and 8). Every process under a root
    #: prefix uses one ``G``.
    gc_grace_ms: int = 600_000  # 10 minutes
    #: A sink's exactly-once progress in ``meta/control`` (docs/protocol.md section 9) is dropped when
    #: it has not committed to that partition for this long (Kafka's
    #: ``transactional.id.expiration.ms``), so ``sinks`` does not grow with every query ever run.
    sink_progress_retention_ms: int = 7 * 24 * 3600 * 1000  # 7 days
    #: Writers refuse a record (key, value and headers) larger than this, before any I/O
    #: (Kafka's ``max.message.bytes``).
    max_record_bytes: int = 1 << 20
    #: Compression of record bodies (docs/protocol.md section 11): ``none`` (value-only records stay
    #: bytes-batch-v1, the fastest path), ``zstd`` or ``lz4``; Kafka's ``compression.type``.
    compression_type: str = "none"
    #: Settings per topic, as JSON ``{"topic": {"compression.type": "zstd"}}`` (Kafka's names);
    #: a topic's setting wins over the one above, and its topic record's (docs/protocol.md section 10) over both.
    topic_config: str | None = None
    #: Writers (the sink, the broker, ``LogWriter(auto_initialize=True)``) create a topic that has
    #: no record on first use, with ``default_partitions`` partitions or enough for the partitions
    #: the write names, whichever is more, and grow it when a later write names a higher partition (Kafka's
    #: ``auto.create.topics.enable``, ``num.partitions``; docs/protocol.md section 10.2).
    auto_create_topics: bool = True
    #: Partitions of a topic created on first use, at least (above).
    default_partitions: int = 1
    #: The most partitions a write makes a topic created on first use have, by creating or growing
    #: it: a wrong partition number must not make a million partitions (docs/protocol.md section 10.2).
    #: More is for ``llog topics create`` or ``alter``.
    max_auto_partitions: int = 1024
    #: Retention of a topic without its own ``retention.ms`` (Kafka's ``log.retention.ms``):
    #: records older than this (7 days by default) are dropped; -1: no limit.
    retention_ms: int = 7 * 24 * 3600 * 1000
    #: Retention of a topic without its own ``retention.bytes`` (Kafka's ``log.retention.bytes``):
    #: the oldest records of a partition are dropped while it holds more; -1: no limit.
    retention_bytes: int = -1

    def __post_init__(self) -> None:
        problems = []
        lo, hi = SESSION_TIMEOUT_RANGE_MS
        if not lo <= self.oxia_session_timeout_ms <= hi:
            problems.append(
                f"LLOG_OXIA_SESSION_TIMEOUT_MS={self.oxia_session_timeout_ms} must be in {lo}..{hi}"
            )
        for name in ("oxia_request_timeout_ms", "s3_max_attempts", "batch_max_bytes", "batch_max_delay_ms",
                     "batch_max_buffer_bytes", "broker_max_request_bytes", "broker_max_wait_ms",
                     "cas_max_attempts", "gc_grace_ms",
                     "sink_progress_retention_ms", "max_record_bytes", "default_partitions",
                     "max_auto_partitions"):
            if getattr(self, name) < 1:
                problems.append(f"{ENV_NAMES[name]}={getattr(self, name)} must be >= 1")
        for name in ("retention_ms", "retention_bytes"):
            if getattr(self, name) < -1:
                problems.append(f"{ENV_NAMES[name]}={getattr(self, name)} must be >= -1 (-1: no limit)")
        if self.tail_cache_max_bytes < 0:
            problems.append(f"LLOG_TAIL_CACHE_MAX_BYTES={self.tail_cache_max_bytes} must be >= 0 (0 turns it off)")
        if self.broker_role not in ("write", "read", "both"):
            problems.append(f"LLOG_BROKER_ROLE={self.broker_role!r} must be write, read or both")
        if self.metrics_scan_interval_s <= 0:
            problems.append(f"LLOG_METRICS_SCAN_INTERVAL_S={self.metrics_scan_interval_s} must be > 0")
        if self.s3_timeout_s <= 0:
            problems.append(f"LLOG_S3_TIMEOUT_S={self.s3_timeout_s} must be > 0")
        if not self.root_prefix or self.root_prefix.startswith("/") or self.root_prefix.endswith("/"):
            problems.append(f"LLOG_ROOT_PREFIX={self.root_prefix!r} must be non-empty, without a leading or trailing '/'")
        if self.compression_type not in COMPRESSION_TYPES:
            problems.append(f"LLOG_COMPRESSION_TYPE={self.compression_type!r} must be one of {', '.join(COMPRESSION_TYPES)}")
        try:
            self._topic_settings()
        except ConfigError as e:
            problems.append(str(e))
        if problems:
            raise ConfigError("invalid llog configuration: " + "; ".join(problems))

    # --- per-topic settings -------------------------------------------------------------------

    def _topic_settings(self) -> dict[str, dict[str, str]]:
        return _parse_topic_config(self.topic_config) if self.topic_config else {}

    def compression(self, topic: str) -> str:
        """The compression of ``topic``'s record bodies: its ``compression.type`` in
        ``LLOG_TOPIC_CONFIG``, else ``LLOG_COMPRESSION_TYPE``."""
        return self._topic_settings().get(topic, {}).get("compression.type", self.compression_type)

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        options: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        settings_path: Path | str | None = None,
    ) -> "Config":
        """Build a config from options, environment, settings files and defaults (module doc)."""
        env = os.environ if env is None else env
        layers = [
            _from_options(options or {}),
            {f: env[n] for f, n in ENV_NAMES.items() if env.get(n)},
            read_config_file(Path(env[CONFIG_FILE_ENV]).expanduser()) if env.get(CONFIG_FILE_ENV) else {},
            _read_settings_file(Path(settings_path) if settings_path else settings_file()),
            {f: env[n] for f, names in AWS_FALLBACKS.items() for n in reversed(names) if env.get(n)},
        ]
        values: dict[str, Any] = {}
        for layer in reversed(layers):  # lowest precedence first, later layers overwrite
            values.update(layer)
        return cls(**_coerce(values))

    @classmethod
    def from_env(cls) -> "Config":
        return cls.load()

    def require(self, *fields: str) -> "Config":
        """Raise one :class:`ConfigError` listing every named field that is unset."""
        missing = [ENV_NAMES[f] for f in fields if not getattr(self, f)]
        if missing:
            raise ConfigError(
                "missing llog settings: " + ", ".join(missing)
                + f" (set them as environment variables, pass them as llog.* options, put them in "
                f"the TOML file ${CONFIG_FILE_ENV} names, or run `llog stack up`, which writes {settings_file()})"
            )
        return self

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)

    def to_options(self) -> dict[str, str]:
        """The settings as ``LLOG_*`` string options, to ship to another process (a Spark
        executor) that should use exactly this config."""
        return {
            ENV_NAMES[f.name]: str(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }


@functools.lru_cache(maxsize=16)
def _parse_topic_config(text: str) -> dict[str, dict[str, str]]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"LLOG_TOPIC_CONFIG is not JSON: {e}") from None
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ConfigError('LLOG_TOPIC_CONFIG must be a JSON object of topic -> {"setting": value}')
    for topic, settings in raw.items():
        for name, value in settings.items():
            if name not in TOPIC_SETTINGS:
                raise ConfigError(f"LLOG_TOPIC_CONFIG: unknown setting {name!r} of topic {topic!r}; "
                                  f"known: {', '.join(TOPIC_SETTINGS)}")
            if value not in TOPIC_SETTINGS[name]:
                raise ConfigError(f"LLOG_TOPIC_CONFIG: {name}={value!r} of topic {topic!r} must be one of "
                                  f"{', '.join(TOPIC_SETTINGS[name])}")
    return raw


def _option_field(key: str) -> str | None:
    if key.upper() in ENV_NAMES.values():  # Spark hands options over lower-cased
        return next(f for f, n in ENV_NAMES.items() if n == key.upper())
    if key.lower().startswith("llog."):
        name = key[5:].lower().replace(".", "_").replace("-", "_")
        return name if name in ENV_NAMES else None
    return None


def _from_options(options: Mapping[str, Any]) -> dict[str, Any]:
    values, unknown = {}, []
    for key, value in options.items():
        name = _option_field(key)
        if name is None:
            if key.lower().startswith(("llog.", "llog_")):
                unknown.append(key)
            continue  # options of the caller's own (a connector's "topic", say)
        if value is not None and value != "":
            values[name] = value
    if unknown:
        known = ", ".join(sorted("llog." + f.replace("_", ".") for f in ENV_NAMES))
        raise ConfigError(f"unknown llog option(s) {', '.join(sorted(unknown))}; known options: {known}")
    return values


def _read_settings_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read llog settings file {path}: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"llog settings file {path} must hold a JSON object of LLOG_* names")
    return {f: raw[n] for f, n in ENV_NAMES.items() if raw.get(n) not in (None, "")}


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings of a TOML file (:data:`CONFIG_FILE_ENV`), by field name: top-level keys that
    are ``LLOG_*`` names, with values of the field's TOML type (a string, an integer, a float or
    an integer, a boolean); an empty string counts as unset. The file must exist, as someone named
    it. Anything else, and a value :class:`Config` refuses, is a :class:`ConfigError` naming the
    file and the key."""
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read llog config file {path} (${CONFIG_FILE_ENV}): {e}") from None
    fields = {n: f for f, n in ENV_NAMES.items()}
    types = {f.name: f.type for f in dataclasses.fields(Config)}
    values = {}
    for key, value in raw.items():
        name = fields.get(key)
        if name is None:
            hint = fields.get(key.upper()) or fields.get("LLOG_" + key.upper().replace(".", "_"))
            raise ConfigError(f"llog config file {path}: unknown key {key!r}"
                              + (f" (keys are LLOG_* names: did you mean {ENV_NAMES[hint]}?)" if hint else
                                 f"; known keys: {', '.join(ENV_NAMES.values())}"))
        if value == "":
            continue
        if not _has_toml_type(value, types[name]):
            raise ConfigError(f"llog config file {path}: {key} = {value!r} must be a TOML "
                              + {"int": "integer", "float": "number", "bool": "boolean (true or false)"}
                              .get(types[name], "string"))
        values[name] = float(value) if types[name] == "float" else value
    try:
        Config(**values)  # the file's values alone: so a refusal names the file
    except ConfigError as e:
        raise ConfigError(f"llog config file {path}: {e}") from None
    return values


def _has_toml_type(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(value)
    return text in ("true", "1", "yes")


def _coerce(values: dict[str, Any]) -> dict[str, Any]:
    types = {f.name: f.type for f in dataclasses.fields(Config)}
    out = {}
    for name, value in values.items():
        kind = types[name]
        try:
            if kind == "bool":
                out[name] = _bool(value)
            elif kind == "int":
                out[name] = int(value)
            elif kind == "float":
                out[name] = float(value)
            else:
                out[name] = str(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{ENV_NAMES[name]}={value!r} is not a valid {kind}") from None
    return out


# --- documentation --------------------------------------------------------------------------------


def field_docs() -> dict[str, str]:
    """Each :class:`Config` field's documentation: the ``#:`` comment lines right above it in
    this module's source (the convention Sphinx reads too), joined into one paragraph."""
    names = {f.name for f in dataclasses.fields(Config)}
    docs: dict[str, str] = {}
    comment: list[str] = []
    for line in inspect.getsource(Config).splitlines():
        text = line.strip()
        if text.startswith("#:"):
            comment.append(text[2:].strip())
            continue
        declared = re.match(r"(\w+)\s*:", text)
        if declared and declared.group(1) in names and comment:
            docs[declared.group(1)] = " ".join(comment)
        comment = []
    return docs


def _toml_value(value: Any) -> str:
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:_}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string


def _field_doc(f: dataclasses.Field, docs: dict[str, str]) -> str:
    """``f``'s documentation as one Markdown paragraph: a field named in it is named by its
    ``LLOG_*`` name, and its AWS fallbacks are said."""
    doc = re.sub(r"``(\w+)``", lambda m: f"`{ENV_NAMES.get(m.group(1), m.group(1))}`", docs.get(f.name, ""))
    doc = doc.replace("``", "`")
    fallbacks = AWS_FALLBACKS.get(f.name)
    if fallbacks:
        doc += f" If no llog layer sets it: ${', else $'.join(fallbacks)}."
    return doc


def example_toml() -> str:
    """A TOML settings file listing every setting, commented out at its default, with its
    meaning (:func:`field_docs`); loaded unchanged, or with every line uncommented, it gives
    ``Config()``. ``conf/llog.example.toml`` is this text."""
    docs = field_docs()
    out = [
        "# llog settings: every LLOG_* setting, commented out at its default, with its meaning.",
        "#",
        "# GENERATED from llog/config.py (the #: comments of Config) by",
        "#     python -m llog.config example > conf/llog.example.toml",
        "# Do not edit it here: change llog/config.py and generate it again (a unit test compares them).",
        "#",
        f"# To use it, copy it, uncomment and change what you need, and point ${CONFIG_FILE_ENV} at the copy.",
        "# Keys are the LLOG_* names (as in the environment); values are TOML strings, integers, floats",
        '# or booleans; "" means unset. An unknown key or a bad value is an error naming this file and',
        "# the key. The file may hold secrets (LLOG_S3_SECRET_ACCESS_KEY): keep it private.",
        "#",
        "# Where a setting comes from, first match wins: llog.* options of a Spark query, LLOG_*",
        f"# environment variables, this file (${CONFIG_FILE_ENV}), the local stack's settings file",
        "# (`llog stack up`), AWS_* fallbacks (region and credentials), the default.",
    ]
    for f in dataclasses.fields(Config):
        doc = _field_doc(f, docs)
        if f.default is None and "unset:" not in doc.lower():
            doc += " Default: unset."
        out.append("")
        out.extend(textwrap.wrap(doc, width=98, initial_indent="# ", subsequent_indent="# ",
                                 break_on_hyphens=False))
        out.append(f"# {ENV_NAMES[f.name]} = {_toml_value(f.default)}")
    return "\n".join(out) + "\n"


#: The lines of docs/configuration.md between which :func:`settings_table` stands.
DOCS_TABLE_BEGIN = "<!-- BEGIN GENERATED: python -m llog.config docs-table (from llog/config.py; do not edit) -->"
DOCS_TABLE_END = "<!-- END GENERATED -->"


def settings_table() -> str:
    """Every setting as a Markdown table, ``LLOG_*`` name, default and meaning
    (:func:`field_docs`), for the documentation site's configuration page."""
    docs = field_docs()
    out = ["| setting | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(Config):
        default = "unset" if f.default is None else f"`{_toml_value(f.default)}`"
        meaning = _field_doc(f, docs).replace("|", "\\|")
        out.append(f"| `{ENV_NAMES[f.name]}` | {default} | {meaning} |")
    return "\n".join(out) + "\n"


def with_settings_table(page: str) -> str:
    """``page`` (docs/configuration.md's text) with :func:`settings_table` between its
    :data:`DOCS_TABLE_BEGIN` and :data:`DOCS_TABLE_END` lines."""
    begin, end = page.find(DOCS_TABLE_BEGIN + "\n"), page.find("\n" + DOCS_TABLE_END)
    if begin < 0 or end < begin:
        raise ConfigError(f"the page has no {DOCS_TABLE_BEGIN!r} line followed by a {DOCS_TABLE_END!r} line")
    return page[:begin + len(DOCS_TABLE_BEGIN) + 1] + settings_table() + page[end + 1:]


def positive(kind):
    """An argparse type: a positive ``int``, or a positive finite ``float`` (argparse names the
    argument in the error). The ``llog`` command and the compaction job share it."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be {'>= 1' if kind is int else '> 0'}, got {text}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llog.config", description="llog's settings.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("example", help="print a TOML settings file with every setting at its default "
                                        "(conf/llog.example.toml)")
    table = commands.add_parser("docs-table", help="print the settings as a Markdown table, or with --write PAGE, "
                                                   "put it between the GENERATED lines of PAGE (docs/configuration.md)")
    table.add_argument("--write", metavar="PAGE", type=Path)
    args = parser.parse_args(argv)
    if args.command == "example":
        sys.stdout.write(example_toml())
    elif args.write:
        args.write.write_text(with_settings_table(args.write.read_text()))
    else:
        sys.stdout.write(settings_table())
    return 0


if __name__ == "__main__":
    # `python -m llog.config` runs this file as __main__, a second copy of the module (llog's
    # __init__ imported the first): run the first's main, so there is one Config class.
    from llog.config import main as _main

    sys.exit(_main())
