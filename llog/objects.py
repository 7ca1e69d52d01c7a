"""Object storage access over boto3: put, get, range get, list, batch delete (docs/protocol.md
section 3). The only module that talks to S3.

Every request has connect/read timeouts (``LLOG_S3_TIMEOUT_S``) and is retried here, up to
``LLOG_S3_MAX_ATTEMPTS`` attempts, when it fails in transit (no connection, a timeout, a body
that breaks off) or S3 answers 5xx/429/SlowDown. The waits between attempts grow from 1 s to
8 s, so the default 5 attempts ride through about 15 s of S3 being away (a restart), and the
final error names the endpoint, the object or bucket, the attempts and the time they took.
The retries are ours, not botocore's (it gets one attempt per call): one policy for both
request paths below, and none of botocore's retry quota, which stops retrying altogether after
a long outage. Creating an ``ObjectStore`` does no I/O. Bodies carry their own CRC, so
request checksums are only sent where S3 requires them, and PUT bodies are not hashed into the
signature (``UNSIGNED-PAYLOAD``): hashing costs about 0.6 ms of CPU per MB written, a third of
what a PUT costs this client. The request is still signed; TLS (an ``https`` endpoint) protects
the body in transit.

PUTs and GETs, the write and read paths' hot loops, skip botocore's per-request machinery
(about 2 ms of CPU per GET, three times what the request itself costs; a PUT of 300 KB took 1.2
ms longer and twice the CPU through ``put_object``): boto3 presigns the URL (0.1 ms; a GET's is
kept for a few minutes) and urllib3 sends the request, with the same attempts, timeouts and
error mapping. A GET URL refused (403, say an expired session token) is signed again once.
LIST pages do the same and read the XML with ElementTree: 8-21 µs of CPU an object, against
61-78 µs through botocore's parser (:meth:`ObjectStore.list`).
"""

from __future__ import annotations

import collections
import email.utils
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar
from xml.etree import ElementTree

import botocore.exceptions
import urllib3
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from llog import deployment
from llog.config import Config
from llog.errors import ObjectNotFound, StorageError
from llog.keys import parse_s3_uri, s3_uri
from llog.metrics import OpTimings

log = logging.getLogger(__name__)
T = TypeVar("T")
_DELETE_BATCH = 1000  # S3's limit per DeleteObjects request
_URL_EXPIRES_S = 3600  # lifetime of a presigned GET URL
_URL_KEEP_S = 300  # how long one is reused
_URL_CACHE_MAX = 4096
_TRANSIENT_CODES = {"RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete", "SlowDown",
                    "Throttling", "ThrottlingException", "RequestThrottled", "ServiceUnavailable", "InternalError"}


class _Transient(Exception):
    """A GET failed in a way worth another attempt (connection error, 5xx, short body)."""


def _is_transient(error: BaseException) -> bool:
    if isinstance(error, (_Transient, botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError)):
        return True
    if isinstance(error, botocore.exceptions.ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or status == 429 or error.response.get("Error", {}).get("Code") in _TRANSIENT_CODES
    return False


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: datetime


def _list_result(xml: bytes) -> tuple[list[ObjectInfo], str | None]:
    """A ListObjectsV2 answer's objects and next continuation token (None when not truncated).
    Keys come URL-encoded when the request asked so (botocore's presigned URL does, so that any
    key survives XML)."""
    root = ElementTree.fromstring(xml)
    ns = root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    decode = urllib.parse.unquote_plus if root.findtext(ns + "EncodingType") == "url" else str
    objects = [ObjectInfo(decode(c.findtext(ns + "Key")), int(c.findtext(ns + "Size")),
                          datetime.fromisoformat(c.findtext(ns + "LastModified")))
               for c in root.iterfind(ns + "Contents")]
    truncated = root.findtext(ns + "IsTruncated") == "true"
    token = root.findtext(ns + "NextContinuationToken") if truncated else None
    if truncated and not token:
        raise ValueError("a truncated page without NextContinuationToken")
    return objects, token


def make_s3_client(config: Config, max_pool_connections: int = 32, attempts: int | None = None):
    """A boto3 S3 client for ``config``, making ``attempts`` attempts per request with botocore's
    standard retries (default ``LLOG_S3_MAX_ATTEMPTS``; benchmarks use it for raw baselines)."""
    # Imported here: a third of a second that a process which never calls S3 (a stream's
    # planner on the driver) should not pay.
    import boto3
    from botocore.config import Config as BotoConfig

    try:
        return boto3.session.Session().client(
            "s3",
            endpoint_url=config.s3_endpoint_url,
            region_name=config.s3_region_name,
            aws_access_key_id=config.s3_access_key_id,
            aws_secret_access_key=config.s3_secret_access_key,
            aws_session_token=config.s3_session_token,
            config=BotoConfig(
                retries={"total_max_attempts": attempts or config.s3_max_attempts, "mode": "standard"},
                connect_timeout=min(config.s3_timeout_s, 10.0),
                read_timeout=config.s3_timeout_s,
                max_pool_connections=max_pool_connections,
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                s3={"addressing_style": "path", "payload_signing_enabled": False},  # module doc
                # SigV4 for presigned URLs too: botocore presigns with SigV2 otherwise, which S3
                # regions opened since 2014 and other S3 servers (versitygw) refuse.
                signature_version="s3v4",
            ),
        )
    except (ValueError, botocore.exceptions.BotoCoreError) as e:
        raise StorageError(f"cannot create an S3 client for endpoint {config.s3_endpoint_url!r} "
                           f"(LLOG_S3_ENDPOINT_URL): {e}") from e


class ObjectStore:
    """Thread-safe access to the configured bucket (writes) and any ``s3://`` URI (reads)."""

    def __init__(self, config: Config):
        self.config = config
        self._endpoint = config.s3_endpoint_url or f"AWS S3 ({config.s3_region_name})"
        self._client = None  # boto3's, made when first needed (:attr:`_s3`)
        self._lock = threading.Lock()
        self.stats: collections.Counter[str] = collections.Counter()
        #: Latency and failures per operation (:meth:`_call`), for whoever exposes metrics.
        self.timings = OpTimings()
        self._http = urllib3.PoolManager(
            maxsize=32, retries=False,
            timeout=urllib3.Timeout(connect=min(config.s3_timeout_s, 10.0), read=config.s3_timeout_s))
        self._urls: dict[tuple[str, str], tuple[str, float]] = {}
        self._gate_passed = False

    def _pass_gate(self) -> None:
        """Before this store's first write: the deployment gate (docs/protocol.md section 9.2)."""
        if not self._gate_passed:
            self._gate_passed = deployment.pass_gate(self.config, objects=self)

    @property
    def _s3(self):
        """boto3's S3 client, made on first use: making one takes a quarter of a second of CPU
        (its service model is read from JSON), which a process that never calls S3 is spared."""
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = make_s3_client(self.config, attempts=1)  # retried by _call
                client = self._client
        return client

    def _count(self, op: str, nbytes: int = 0) -> None:
        with self._lock:
            self.stats[op] += 1
            self.stats[f"{op}_bytes"] += nbytes

    def _fail(self, op: str, target: str, error: object) -> StorageError:
        return StorageError(f"s3 {op} {target} at {self._endpoint} failed: {error}")

    def _call(self, op: str, target: str, fn: Callable[[], T], timed_as: str | None = None) -> T:
        """``fn()``, with transient failures retried (module doc); other errors as they are.
        Its time and error go to :attr:`timings` as ``timed_as`` (default ``op``)."""
        started = time.monotonic()
        error = None
        try:
            return self._retried(op, target, fn, started)
        except BaseException as e:
            error = e
            raise
        finally:
            self.timings.observe(timed_as or op, time.monotonic() - started, error)

    def _retried(self, op: str, target: str, fn: Callable[[], T], started: float) -> T:
        retrying = Retrying(
            retry=retry_if_exception(_is_transient),
            stop=stop_after_attempt(self.config.s3_max_attempts),
            wait=wait_exponential_jitter(initial=1.0, max=8.0, jitter=0.5),
            before_sleep=lambda state: log.warning("s3 %s %s at %s failed (%s), retrying", op, target,
                                                   self._endpoint, state.outcome.exception()),
            reraise=True,
        )
        try:
            return retrying(fn)
        except (_Transient, botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            attempts = retrying.statistics.get("attempt_number", 1)
            raise StorageError(f"s3 {op} {target} at {self._endpoint} failed after {attempts} attempt(s) in "
                               f"{time.monotonic() - started:.1f} s: {e}") from e

    # --- writes -------------------------------------------------------------------------------

    def put(self, key: str, pieces: Sequence[object] | bytes) -> str:
        """Write an object to the configured bucket; returns its ``s3://`` URI.

        ``pieces`` are written back to back (one copy to join them).
        """
        bucket = self.config.require("s3_bucket").s3_bucket
        self._pass_gate()
        body = pieces if isinstance(pieces, bytes) else b"".join(pieces)
        self._count("put", len(body))
        self._call("put", s3_uri(bucket, key), lambda: self._send(bucket, key, body))
        return s3_uri(bucket, key)

    def _send(self, bucket: str, key: str, body: bytes) -> None:
        """One PUT with a presigned URL over the shared connection pool: a third less time and
        half the CPU of botocore's ``put_object`` here (which also checksums the body; every
        body llog writes carries its own CRC, checked when read)."""
        try:
            url = self._s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key},
                                                  ExpiresIn=_URL_EXPIRES_S)
        except botocore.exceptions.BotoCoreError as e:
            raise self._fail("presign", s3_uri(bucket, key), e) from e
        try:
            response = self._http.request("PUT", url, body=body, preload_content=True)
        except urllib3.exceptions.HTTPError as e:
            raise _Transient(str(e)) from e
        if response.status == 200:
            return
        if response.status >= 500 or response.status == 429:
            raise _Transient(f"HTTP {response.status}: {response.data[:200]!r}")
        raise self._fail("put", s3_uri(bucket, key), f"HTTP {response.status}: {response.data[:300]!r}")

    def delete_many(self, uris: Sequence[str]) -> int:
        """Delete objects in batches of 1000; returns how many were deleted."""
        self._pass_gate()
        by_bucket: dict[str, list[str]] = collections.defaultdict(list)
        for uri in uris:
            bucket, key = parse_s3_uri(uri)
            by_bucket[bucket].append(key)
        deleted = 0
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), _DELETE_BATCH):
                chunk = keys[i:i + _DELETE_BATCH]
                self._count("delete")
                request = {"Objects": [{"Key": k} for k in chunk], "Quiet": True}
                response = self._call("delete", f"{len(chunk)} objects in s3://{bucket}",
                                      lambda: self._s3.delete_objects(Bucket=bucket, Delete=request))
                errors = response.get("Errors", [])
                if errors:
                    raise StorageError(f"s3 delete in s3://{bucket} at {self._endpoint} failed for {len(errors)} "
                                       f"objects, first: {errors[0]}")
                deleted += len(chunk)
        return deleted

    # --- reads --------------------------------------------------------------------------------

    def get(self, uri: str, byte_offset: int | None = None, byte_length: int | None = None) -> bytes:
        """The object at ``uri``, or ``byte_length`` bytes of it from ``byte_offset``."""
        return self.get_with_size(uri, byte_offset, byte_length)[0]

    def get_with_size(self, uri: str, byte_offset: int | None = None,
                      byte_length: int | None = None) -> tuple[bytes, int]:
        """Like :meth:`get`, also returning the whole object's size (from Content-Range)."""
        bucket, key = parse_s3_uri(uri)
        headers = {}
        if byte_offset is not None:
            if byte_length is None or byte_length < 1:
                raise ValueError(f"range get of {uri} needs byte_length >= 1, got {byte_length}")
            headers["Range"] = f"bytes={byte_offset}-{byte_offset + byte_length - 1}"
        self._count("range_get" if byte_offset is not None else "get")
        body, size = self._call("get", uri, lambda: self._fetch(uri, bucket, key, headers),
                                timed_as="range_get" if byte_offset is not None else "get")
        with self._lock:
            self.stats["get_bytes"] += len(body)
        if byte_length is not None and len(body) != byte_length:
            raise StorageError(f"range get of {uri} returned {len(body)} bytes, expected {byte_length} "
                               f"(the object is {size} bytes)")
        return body, size

    def _fetch(self, uri: str, bucket: str, key: str, headers: dict[str, str]) -> tuple[bytes, int]:
        for fresh in (False, True):
            url = self._url(bucket, key, fresh)
            try:
                response = self._http.request("GET", url, headers=headers, preload_content=True)
            except urllib3.exceptions.HTTPError as e:
                raise _Transient(str(e)) from e
            status = response.status
            if status in (200, 206):
                content_range = response.headers.get("Content-Range")
                body = response.data
                return body, int(content_range.rsplit("/", 1)[1]) if content_range else len(body)
            if status == 404:
                raise ObjectNotFound(f"object {uri} does not exist")
            if status == 416:
                raise StorageError(f"range {headers.get('Range')} lies outside object {uri}")
            if status == 403 and not fresh:
                continue  # the URL may have outlived its credentials: sign again
            if status >= 500 or status == 429:
                raise _Transient(f"HTTP {status}: {response.data[:200]!r}")
            raise self._fail("get", uri, f"HTTP {status}: {response.data[:300]!r}")
        raise AssertionError("unreachable")

    def _url(self, bucket: str, key: str, fresh: bool) -> str:
        now = time.monotonic()
        cached = self._urls.get((bucket, key))
        if cached is not None and not fresh and now - cached[1] < _URL_KEEP_S:
            return cached[0]
        try:
            url = self._s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key},
                                                  ExpiresIn=_URL_EXPIRES_S)
        except botocore.exceptions.BotoCoreError as e:
            raise self._fail("presign", s3_uri(bucket, key), e) from e
        if len(self._urls) >= _URL_CACHE_MAX:
            self._urls.clear()
        self._urls[(bucket, key)] = (url, now)
        return url

    def last_modified_ms(self, uri: str) -> int | None:
        """The object's ``Last-Modified`` (the S3 server's clock, whole seconds) in ms since the
        epoch, by one HEAD; None if it does not exist. What GC judges a blob's age by
        (docs/protocol.md section 9.2)."""
        bucket, key = parse_s3_uri(uri)
        self._count("head")

        def head() -> int | None:
            try:
                url = self._s3.generate_presigned_url("head_object", Params={"Bucket": bucket, "Key": key},
                                                      ExpiresIn=_URL_EXPIRES_S)
            except botocore.exceptions.BotoCoreError as e:
                raise self._fail("presign", uri, e) from e
            try:
                response = self._http.request("HEAD", url, preload_content=True)
            except urllib3.exceptions.HTTPError as e:
                raise _Transient(str(e)) from e
            if response.status == 404:
                return None
            if response.status >= 500 or response.status == 429:
                raise _Transient(f"HTTP {response.status}")
            if response.status != 200:
                raise self._fail("head", uri, f"HTTP {response.status}")
            modified = response.headers.get("Last-Modified")
            if not modified:
                raise self._fail("head", uri, "no Last-Modified header")
            return int(email.utils.parsedate_to_datetime(modified).timestamp() * 1000)

        return self._call("head", uri, head)

    def list(self, prefix: str, bucket: str | None = None) -> Iterator[ObjectInfo]:
        """Objects under ``prefix`` in ``bucket`` (default: the configured one), page by page
        (ListObjectsV2, up to 1,000 objects a page), each page a call of its own with its own
        retries.

        Like PUTs and GETs, a page skips botocore's machinery (module doc). Its parser took
        61-78 µs of CPU an object, two thirds of it dateutil reading ``LastModified``, holding
        the GIL: the HTTP broker's bucket scan (when it starts, then every minute) of a couple of
        thousand objects held its flushes back: 4 of 542 took over 50 ms, one over 100 ms
        (docs/benchmarks.md, the Kafka listener's waiting consumer)."""
        bucket = bucket or self.config.require("s3_bucket").s3_bucket
        token: str | None = None
        while True:
            objects, token = self._call("list", f"s3://{bucket}/{prefix}",
                                        lambda: self._list_page(bucket, prefix, token))
            self._count("list")
            yield from objects
            if token is None:
                return

    def _list_page(self, bucket: str, prefix: str, token: str | None) -> tuple[list[ObjectInfo], str | None]:
        """One ListObjectsV2 page: its objects, and the token of the next page (None: the last)."""
        params = {"Bucket": bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
        try:
            url = self._s3.generate_presigned_url("list_objects_v2", Params=params, ExpiresIn=_URL_EXPIRES_S)
        except botocore.exceptions.BotoCoreError as e:
            raise self._fail("presign", f"s3://{bucket}/{prefix}", e) from e
        try:
            response = self._http.request("GET", url, preload_content=True)
        except urllib3.exceptions.HTTPError as e:
            raise _Transient(str(e)) from e
        if response.status >= 500 or response.status == 429:
            raise _Transient(f"HTTP {response.status}: {response.data[:200]!r}")
        if response.status != 200:
            raise self._fail("list", f"s3://{bucket}/{prefix}", f"HTTP {response.status}: {response.data[:300]!r}")
        try:
            return _list_result(response.data)
        except (ElementTree.ParseError, KeyError, ValueError, TypeError) as e:  # a body cut short, say
            raise _Transient(f"unreadable ListObjectsV2 answer ({e}): {response.data[:200]!r}") from e

    def server_time_ms(self, clock) -> tuple[int, int, int]:
        """The S3 server's time (its ``Date`` header on a HEAD of the bucket, whole seconds), and
        ``clock``'s before and after the request, all in ms since the epoch."""
        bucket = self.config.require("s3_bucket").s3_bucket
        s3 = self._s3  # made first: making it takes longer than the request
        started = clock.now_ms()
        response = self._call("head", bucket, lambda: s3.head_bucket(Bucket=bucket))
        ended = clock.now_ms()
        date = response["ResponseMetadata"]["HTTPHeaders"]["date"]
        return int(email.utils.parsedate_to_datetime(date).timestamp() * 1000), started, ended

    def close(self) -> None:
        self._http.clear()
        if self._client is not None:
            self._client.close()
