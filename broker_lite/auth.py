"""API keys for the broker: who may produce to, consume from, and administer which topics.

Auth is on when ``LLOG_BROKER_AUTH`` is set, to the path of a JSON keys file or to the JSON itself
(a value starting with ``{``)::

    {"keys": [
      {"name": "ingest", "key_sha256": "<64 hex digits>", "produce": ["orders.", "clicks"]},
      {"name": "reports", "key_sha256": "<64 hex digits>", "consume": ["orders."], "groups": ["reports-"]},
      {"name": "ops", "key": "a-plain-secret", "produce": ["*"], "consume": ["*"], "groups": ["*"], "admin": true}
    ]}

- A key is given as ``key`` (plain text) or ``key_sha256`` (its SHA-256 in hex, so the file need not
  hold secrets; ``python -m broker_lite.auth hash`` prints it). The broker keeps only digests and
  compares them with :func:`hmac.compare_digest`.
- Permissions are lists of name prefixes, ``"*"`` for every name: ``produce`` and ``consume``
  name topics (``consume`` also covers committing and describing group offsets of those topics),
  ``groups`` names consumer groups (committing or describing a group needs both ``groups`` on the
  group and ``consume`` on its topics), ``admin: true`` allows ``/metrics`` and
  ``/metrics/prometheus`` and every topic in ``/topics`` (which otherwise shows a key the topics
  it may produce to or consume from). A prefix is a plain prefix, as Kafka's PREFIXED ACLs: ``"clicks"``
  also covers ``clicks-raw``, so end prefixes with a separator (``"orders."``) to mean a family.
- A request carries its key as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``. No key, a
  malformed header or an unknown key is a 401 (:class:`Unauthenticated`, with
  ``WWW-Authenticate``); a known key without the permission is a 403 (:class:`Forbidden`).

Auth is off when the variable is unset, which :func:`check_exposure` allows only on a loopback
address (or with ``--insecure``). Auth on refuses the Kafka listener, which has no authentication
(:func:`check_kafka_listener`). Never log a key: errors name the key's ``name`` only.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import socket
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from llog.errors import ConfigError
from llog.keys import MAX_TOPIC_LENGTH

ENV_VAR = "LLOG_BROKER_AUTH"
REALM = "llog"
ALL = "*"

#: What a key may be allowed: produce/consume name topics, groups names group ids, admin none.
Action = Literal["produce", "consume", "groups", "admin"]
ACTIONS: tuple[str, ...] = ("produce", "consume", "groups", "admin")

_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_HEX = frozenset("0123456789abcdef")


# --- errors ----------------------------------------------------------------------------------

class AuthConfigError(ConfigError):
    """``LLOG_BROKER_AUTH`` names a file that is missing or malformed (the message says where)."""


class ExposureRefused(ConfigError):
    """The broker would listen on a non-loopback address with auth off."""


class KafkaListenerUnauthenticated(ConfigError):
    """The Kafka listener was asked for beside ``LLOG_BROKER_AUTH``: it has no authentication
    (SASL is not served), so every Kafka client could do what the keys forbid."""


class AuthError(Exception):
    """A request refused by auth: answer ``status`` with an ErrorBody of ``error_type`` and
    ``str(self)``, plus :attr:`headers`."""

    status = 0
    error_type = ""

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return []


class Unauthenticated(AuthError):
    """401: no key, a malformed auth header, or a key the file does not hold."""

    status = 401
    error_type = "Unauthenticated"

    def __init__(self, message: str, invalid_token: bool = False):
        super().__init__(message)
        #: RFC 6750 section 3.1: a presented but unusable credential says ``error="invalid_token"``.
        self.invalid_token = invalid_token

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        challenge = f'Bearer realm="{REALM}"' + (', error="invalid_token"' if self.invalid_token else "")
        return [(b"www-authenticate", challenge.encode())]


class Forbidden(AuthError):
    """403: a known key without the permission; names the key, the action and the first name
    not allowed."""

    status = 403
    error_type = "Forbidden"

    def __init__(self, key_name: str, action: str, name: str | None):
        self.key_name, self.action, self.name = key_name, action, name
        what = {"produce": "produce to topic", "consume": "consume from topic", "groups": "use consumer group"}
        if name is None:
            message = f"key {key_name!r} may not {action} (it has no {action!r} permission)"
        else:
            message = f"key {key_name!r} may not {what[action]} {name!r} (not in its {action!r} permissions)"
        super().__init__(message)


# --- the keys file ---------------------------------------------------------------------------

Prefixes = list[Annotated[str, msgspec.Meta(min_length=1)]]


class KeyEntry(msgspec.Struct, forbid_unknown_fields=True):
    """One key of the file (see the module docstring)."""

    name: Annotated[str, msgspec.Meta(min_length=1)]
    key: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    key_sha256: str | None = None
    produce: Prefixes = []
    consume: Prefixes = []
    groups: Prefixes = []
    admin: bool = False


class KeysFile(msgspec.Struct, forbid_unknown_fields=True):
    keys: list[KeyEntry]


def _prefix_problem(prefix: str) -> str | None:
    if prefix == ALL:
        return None
    if ALL in prefix:
        return "'*' stands alone (every entry is a prefix already: write 'orders.' for orders.*)"
    if len(prefix) > MAX_TOPIC_LENGTH:
        return f"is longer than a name may be ({MAX_TOPIC_LENGTH} characters)"
    bad = sorted(set(prefix) - _NAME_CHARS)
    if bad:
        return f"contains {''.join(bad)!r}, which no topic or group name can (letters, digits, '.', '_', '-')"
    return None


def _digest(entry: KeyEntry, where: str) -> bytes:
    if (entry.key is None) == (entry.key_sha256 is None):
        raise AuthConfigError(f"{where}: give exactly one of `key` (the key) and `key_sha256` (its SHA-256 in hex)")
    if entry.key is not None:
        return hashlib.sha256(entry.key.encode()).digest()
    hexdigest = entry.key_sha256.lower()
    if len(hexdigest) != 64 or not set(hexdigest) <= _HEX:
        raise AuthConfigError(f"{where}.key_sha256: expected 64 hex digits (a SHA-256), got {len(entry.key_sha256)} "
                              f"characters{'' if set(hexdigest) <= _HEX else ' with non-hex ones'}")
    return bytes.fromhex(hexdigest)


def _prefixes(values: list[str], where: str) -> tuple[str, ...]:
    for i, prefix in enumerate(values):
        problem = _prefix_problem(prefix)
        if problem:
            raise AuthConfigError(f"{where}[{i}]: {prefix!r} {problem}")
    return tuple(dict.fromkeys(values))


# --- who is asking ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Principal:
    """A key the broker knows, by name, with what it may do."""

    name: str
    produce: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    admin: bool = False

    def allows(self, action: Action, name: str | None = None) -> bool:
        """Whether this key may ``action`` on ``name`` (a topic or group; None for admin)."""
        if action == "admin":
            return self.admin
        prefixes = getattr(self, action)
        return name is not None and any(p == ALL or name.startswith(p) for p in prefixes)

    def require(self, action: Action, names: Iterable[str] = ()) -> None:
        """Raise :class:`Forbidden` unless this key may ``action`` on every one of ``names``
        (topics for produce/consume, groups for groups; none for admin)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}, expected one of {ACTIONS}")
        if action == "admin":
            if not self.admin:
                raise Forbidden(self.name, action, None)
            return
        for name in names:
            if not self.allows(action, name):
                raise Forbidden(self.name, action, name)


#: Whom requests act as when auth is off: everything allowed (so the app can always call
#: ``principal.require``).
UNRESTRICTED = Principal("anonymous", (ALL,), (ALL,), (ALL,), admin=True)


class Auth:
    """The keys of ``LLOG_BROKER_AUTH``; :meth:`authenticate` finds a request's key."""

    def __init__(self, keys: list[tuple[bytes, Principal]]):
        self._keys = keys

    @property
    def names(self) -> list[str]:
        return [p.name for _, p in self._keys]

    @classmethod
    def load(cls, value: str | None) -> Auth | None:
        """The keys from ``value`` (``LLOG_BROKER_AUTH``: a file path, or JSON starting with ``{``);
        None (auth off) when it is unset or blank. Raises :class:`AuthConfigError` naming the
        problem and where it is."""
        if value is None or not value.strip():
            return None
        if value.lstrip().startswith("{"):
            source, raw = f"{ENV_VAR} (inline JSON)", value.encode()
        else:
            path = Path(value).expanduser()
            source = f"{ENV_VAR} file {str(path)!r}"
            try:
                raw = path.read_bytes()
            except OSError as e:
                raise AuthConfigError(f"{source}: cannot read it: {e.strerror or e}") from None
        try:
            parsed = msgspec.json.decode(raw, type=KeysFile)
        except msgspec.ValidationError as e:
            raise AuthConfigError(f"{source}: {e}") from None
        except msgspec.DecodeError as e:
            raise AuthConfigError(f"{source}: not JSON: {e}") from None
        return cls.from_file(parsed, source)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Auth | None:
        return cls.load((os.environ if environ is None else environ).get(ENV_VAR))

    @classmethod
    def from_file(cls, parsed: KeysFile, source: str = ENV_VAR) -> Auth:
        if not parsed.keys:
            raise AuthConfigError(f"{source}: `keys` is empty; unset {ENV_VAR} to turn auth off")
        keys: list[tuple[bytes, Principal]] = []
        names: dict[str, int] = {}
        for i, entry in enumerate(parsed.keys):
            where = f"{source}: `$.keys[{i}]`"
            if entry.name in names:
                raise AuthConfigError(f"{where}: name {entry.name!r} is also the name of $.keys[{names[entry.name]}]")
            names[entry.name] = i
            digest = _digest(entry, where)
            for other, principal in keys:
                if hmac.compare_digest(digest, other):
                    raise AuthConfigError(f"{where}: key {entry.name!r} is the same key as {principal.name!r}")
            keys.append((digest, Principal(entry.name, _prefixes(entry.produce, f"{where}.produce"),
                                           _prefixes(entry.consume, f"{where}.consume"),
                                           _prefixes(entry.groups, f"{where}.groups"), entry.admin)))
        return cls(keys)

    def authenticate(self, headers: Iterable[tuple[bytes, bytes]]) -> Principal:
        """The key ``headers`` carry (ASGI's: lower-case names), or :class:`Unauthenticated`."""
        presented = _presented_key(headers)
        digest = hashlib.sha256(presented).digest()
        found = None
        for stored, principal in self._keys:  # no early exit: the time does not depend on which key
            if hmac.compare_digest(digest, stored):
                found = principal
        if found is None:
            raise Unauthenticated("unknown API key", invalid_token=True)
        return found


def _presented_key(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    authorization = [v for k, v in headers if k == b"authorization"]
    api_key = [v for k, v in headers if k == b"x-api-key"]
    if not authorization and not api_key:
        raise Unauthenticated("this broker wants an API key: send `Authorization: Bearer <key>` or `X-API-Key: <key>`")
    if len(authorization) > 1 or len(api_key) > 1:
        raise Unauthenticated("more than one Authorization or X-API-Key header", invalid_token=True)
    keys = []
    if authorization:
        scheme, _, token = authorization[0].strip().partition(b" ")
        if scheme.lower() != b"bearer":
            raise Unauthenticated("the Authorization header must be `Bearer <key>`", invalid_token=True)
        keys.append(token.strip())
    if api_key:
        keys.append(api_key[0].strip())
    if not all(keys):
        raise Unauthenticated("the key in the auth header is empty", invalid_token=True)
    if len(keys) == 2 and not hmac.compare_digest(keys[0], keys[1]):
        raise Unauthenticated("Authorization and X-API-Key carry different keys", invalid_token=True)
    return keys[0]


# --- where the broker may listen without auth ------------------------------------------------

def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is reachable only from this machine: every address
    it resolves to is a loopback one. ``0.0.0.0``, ``::`` and ``""`` (every interface) are not."""
    host = host.strip().strip("[]")
    if not host:
        return False
    try:
        return _loopback_address(host)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(_loopback_address(a) for a in addresses)


def _loopback_address(text: str) -> bool:
    address = ipaddress.ip_address(text.split("%", 1)[0])  # no IPv6 zone
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 (Python 3.11 calls it not loopback)
    return (mapped or address).is_loopback


def check_exposure(host: str, auth: Auth | None, insecure: bool) -> None:
    """Refuse (:class:`ExposureRefused`) to serve on a non-loopback ``host`` with auth off, unless
    ``insecure`` (``--insecure``) says that is meant."""
    if auth is None and not insecure and not is_loopback(host):
        raise ExposureRefused(
            f"refusing to listen on {host or '(every interface)'!r} with auth off: anyone who can reach it could "
            f"produce and consume. Set {ENV_VAR} to a keys file, listen on 127.0.0.1, or pass --insecure")


def check_kafka_listener(auth: Auth | None, kafka_port: int | None) -> None:
    """Refuse (:class:`KafkaListenerUnauthenticated`) a Kafka listener (``kafka_port`` given)
    beside auth: the listener serves Kafka clients without keys (docs/kafka.md), which would
    bypass every permission of the keys file."""
    if auth is not None and kafka_port is not None:
        raise KafkaListenerUnauthenticated(
            f"the Kafka listener (--kafka-port {kafka_port}) has no authentication (SASL is not served yet, "
            f"docs/kafka.md), so it cannot run beside {ENV_VAR}: any Kafka client could produce, consume and commit "
            f"what the keys forbid. Unset {ENV_VAR} or leave out --kafka-port")


# --- python -m broker_lite.auth ----------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """``hash``: print the SHA-256 of the key read from stdin (for ``key_sha256``); ``new NAME``:
    print a fresh random key and its keys-file entry."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["hash"]:
        key = sys.stdin.readline().rstrip("\r\n")
        if not key:
            print("broker_lite.auth hash: give the key on stdin", file=sys.stderr)
            return 2
        print(hashlib.sha256(key.encode()).hexdigest())
        return 0
    if len(args) == 2 and args[0] == "new":
        key = secrets.token_urlsafe(32)
        entry = {"name": args[1], "key_sha256": hashlib.sha256(key.encode()).hexdigest(), "produce": [], "consume": []}
        print(f"key:   {key}\nentry: {json.dumps(entry)}")
        return 0
    print("usage: python -m broker_lite.auth hash < key | python -m broker_lite.auth new NAME", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
