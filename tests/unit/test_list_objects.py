"""ListObjectsV2 answers as :mod:`llog.objects` reads them (it parses them itself): S3's own
shape, keys URL-encoded when the answer says so, pages, and answers it must refuse."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from llog.objects import ObjectInfo, _list_result

NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def answer(contents: str, truncated: bool = False, token: str | None = None, encoding: str | None = "url") -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{NS}"><Name>b</Name>'
            f'<Prefix>p%2F</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys>'
            + (f"<EncodingType>{encoding}</EncodingType>" if encoding else "")
            + f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{contents}"
            + (f"<NextContinuationToken>{token}</NextContinuationToken>" if token else "")
            + "</ListBucketResult>").encode()


def content(key: str, size: int, when: str) -> str:
    return (f"<Contents><Key>{key}</Key><LastModified>{when}</LastModified><ETag>&quot;0cc1&quot;</ETag>"
            f"<ChecksumAlgorithm>CRC64NVME</ChecksumAlgorithm><Size>{size}</Size>"
            f"<StorageClass>STANDARD</StorageClass></Contents>")


def test_keys_are_decoded_as_s3_encoded_them():
    objects, token = _list_result(answer(content("p/a+b%2Bc%26d%C3%BC", 7, "2026-11-27T23:40:01.123Z")
                                         + content("p/plain", 0, "2026-11-27T23:40:02.000Z")))
    assert token is None
    assert objects == [
        ObjectInfo("p/a b+c&dü", 7, datetime(2026, 11, 27, 23, 40, 1, 123000, tzinfo=timezone.utc)),
        ObjectInfo("p/plain", 0, datetime(2026, 11, 27, 23, 40, 2, tzinfo=timezone.utc))]


def test_keys_stay_as_they_are_without_encoding_and_without_a_namespace():
    body = answer(content("p/a+b%2B", 3, "2026-11-27T23:40:01Z"), encoding=None).replace(f' xmlns="{NS}"'.encode(), b"")
    ((info,), token) = _list_result(body)
    assert info.key == "p/a+b%2B" and info.size == 3 and token is None


def test_a_truncated_page_names_the_next():
    objects, token = _list_result(answer(content("p/x", 1, "2026-11-27T23:40:01Z"), truncated=True, token="1/ab=="))
    assert [o.key for o in objects] == ["p/x"] and token == "1/ab=="


@pytest.mark.parametrize("body", [
    answer("", truncated=True),  # no token to go on with
    answer(content("p/x", 1, "2026-11-27T23:40:01Z"))[:-30],  # cut short
    answer("<Contents><Key>p/x</Key><LastModified>2026-11-27T23:40:01Z</LastModified></Contents>"),  # no size
    answer(content("p/x", 1, "yesterday")),
])
def test_answers_it_cannot_read_are_refused(body):
    with pytest.raises(Exception) as raised:
        _list_result(body)
    assert isinstance(raised.value, (ValueError, TypeError, KeyError, SyntaxError))
