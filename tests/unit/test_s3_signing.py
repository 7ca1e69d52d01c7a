"""The S3 client signs with SigV4, presigned URLs included: botocore's default for a presigned
URL is SigV2, which S3 regions opened since 2014 and other S3 servers (versitygw) refuse. Pure:
presigning is local, no server is reached."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from llog.config import Config
from llog.objects import make_s3_client

CONFIG = Config.load({"llog.s3.endpoint.url": "http://127.0.0.1:1", "llog.s3.bucket": "b",
                      "llog.s3.access.key.id": "key", "llog.s3.secret.access.key": "secret"}, env={})


def test_presigned_urls_are_sigv4_path_style():
    client = make_s3_client(CONFIG)
    for method in ("put_object", "get_object"):
        url = client.generate_presigned_url(method, Params={"Bucket": "b", "Key": "wal/x"}, ExpiresIn=60)
        query = parse_qs(urlsplit(url).query)
        assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"], url
        assert query["X-Amz-Credential"][0].startswith("key/")
        assert "Signature" not in query and "AWSAccessKeyId" not in query  # SigV2's
        assert urlsplit(url).path == "/b/wal/x"  # path-style addressing
