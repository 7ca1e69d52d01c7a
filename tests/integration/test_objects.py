"""The S3 access layer against a real S3 server (versitygw): GETs (presigned, over urllib3) and their errors."""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from llog.deployment import pass_gate
from llog.errors import ObjectNotFound, StorageError
from llog.objects import ObjectStore


@pytest.fixture
def objects(config):
    store = ObjectStore(config)
    yield store
    store.close()


def test_get_whole_and_ranges_with_the_object_size(objects, config):
    data = os.urandom(3 * 1024 * 1024 + 17)
    uri = objects.put(f"{config.root_prefix}/x", data)
    assert objects.get(uri) == data
    assert objects.get_with_size(uri, 1000, 5000) == (data[1000:6000], len(data))
    assert objects.get(uri, len(data) - 1, 1) == data[-1:]
    assert objects.stats["get"] == 1 and objects.stats["range_get"] == 2
    assert objects.stats["get_bytes"] == len(data) + 5001


def test_ranges_of_a_large_object_are_exact_also_when_read_at_once(objects, config):
    """The local S3 server sends ranges with sendfile (``llog_tools.stack.build.S3_SERVER_PATCH``):
    each range has exactly its bytes, from any offset, to the end or not, concurrently too."""
    data = os.urandom(9 * 1024 * 1024 + 123)
    uri = objects.put(f"{config.root_prefix}/large", data)
    rng = random.Random(7)
    ranges = [(0, len(data)), (0, 1), (1, len(data) - 1), (len(data) - 4096, 4096), (8 * 1024 * 1024 - 5, 10),
              *((lo, rng.randint(1, len(data) - lo)) for lo in (rng.randrange(len(data)) for _ in range(24)))]
    with ThreadPoolExecutor(max_workers=6) as pool:
        for (lo, n), body in zip(ranges, pool.map(lambda r: objects.get(uri, *r), ranges)):
            assert body == data[lo:lo + n], (lo, n)


def test_puts_are_signed_without_the_body(objects, config):
    signed = []
    objects._s3.meta.events.register("before-sign.s3.PutObject", lambda request, **_: signed.append(request))
    data = os.urandom(1024)
    uri = objects.put(f"{config.root_prefix}/unsigned", data)
    assert len(signed) == 1 and not signed[0].body  # presigned: the signature covers no body
    assert objects.get(uri) == data
    bad = ObjectStore(config.replace(s3_secret_access_key="wrong"))
    # Its deployment gate passed with the right keys, so what is refused is the PUT itself.
    pass_gate(bad.config, objects=objects)
    try:
        with pytest.raises(StorageError, match="put"):
            bad.put(f"{config.root_prefix}/refused", data)  # the signature still counts
    finally:
        bad.close()


def test_get_errors_name_the_object(objects, config):
    uri = objects.put(f"{config.root_prefix}/small", b"0123456789")
    with pytest.raises(ObjectNotFound, match=f"object s3://{config.s3_bucket}/{config.root_prefix}/nope does not exist"):
        objects.get(f"s3://{config.s3_bucket}/{config.root_prefix}/nope")
    with pytest.raises(StorageError, match="range bytes=20-29 lies outside object"):
        objects.get(uri, 20, 10)
    with pytest.raises(StorageError, match="returned 4 bytes, expected 10"):
        objects.get(uri, 6, 10)  # S3 answers what exists; a short body is an error
    objects.delete_many([uri])
    with pytest.raises(ObjectNotFound):
        objects.get(uri)  # the presigned URL it kept is no licence to read a deleted object


def test_a_refused_url_is_signed_again_once(objects, config):
    uri = objects.put(f"{config.root_prefix}/signed", b"abc")
    assert objects.get(uri) == b"abc"
    key = next(iter(objects._urls))
    url, at = objects._urls[key]
    objects._urls[key] = (url.replace("Signature=", "Signature=00"), at)  # a URL S3 refuses (403)
    assert objects.get(uri) == b"abc"
    bad = ObjectStore(config.replace(s3_secret_access_key="wrong"))
    # Its deployment gate passed with the right keys, so what is refused is the PUT itself.
    pass_gate(bad.config, objects=objects)
    try:
        with pytest.raises(StorageError, match="HTTP 403"):
            bad.get(uri)
    finally:
        bad.close()


def test_listing_pages_through_every_object_as_botocore_reads_them(objects, config):
    """:meth:`ObjectStore.list` parses ListObjectsV2 itself (module doc): the same keys, sizes
    and times as botocore's own parsing, over several pages, keys with characters XML and URLs
    escape included."""
    prefix = f"{config.root_prefix}/listing/"
    odd = ["a b+c", "x&y<z>", "pct%20", "ünï/cödé", "tab\tkey", "q?r=s#t"]
    names = [f"{i:05d}" for i in range(2100)] + odd
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda n: objects.put(prefix + n, b"x" * (len(n) % 7)), names))
    listed = list(objects.list(prefix))
    assert objects.stats["list"] == 3  # 1,000 a page
    expected = [o for page in objects._s3.get_paginator("list_objects_v2").paginate(Bucket=config.s3_bucket,
                                                                                   Prefix=prefix)
                for o in page.get("Contents", [])]
    assert [(i.key, i.size, i.last_modified) for i in listed] == [(o["Key"], o["Size"], o["LastModified"])
                                                                  for o in expected]
    assert sorted(i.key for i in listed) == sorted(prefix + n for n in names)
    assert listed[0].last_modified.tzinfo is not None
    assert list(objects.list(f"{config.root_prefix}/nothing-here/")) == []


def test_list_errors_name_the_prefix(objects, config):
    with pytest.raises(StorageError, match=r"list s3://no-such-bucket-[0-9a-f]+/p/ .*404"):
        list(objects.list("p/", bucket=f"no-such-bucket-{os.urandom(4).hex()}"))
