"""The stack's S3 server: versitygw (:data:`llog_tools.stack.build.S3_SERVER_VERSION`) with its
POSIX backend, its command line, its credentials and region, and its health check (the bucket
created, and a probe object written, read back and deleted)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from llog_tools.stack.network import HOST, PROBE_TIMEOUT_S, StackPorts, http_ok

if TYPE_CHECKING:  # annotations only
    from llog_tools.stack.state import StackPaths


S3_ACCESS_KEY_ID = "llog-local"

S3_SECRET_ACCESS_KEY = "llog-local-secret"

S3_REGION = "us-east-1"

#: Where the S3 server answers health checks (GET, no credentials).
_S3_HEALTH_PATH = "/healthz"


def s3_server_command(paths: StackPaths, ports: StackPorts, binary: Path) -> tuple[list[str], dict[str, str]]:
    """versitygw on the ``s3`` port with its POSIX backend in ``<stack_dir>/s3``, and its
    environment (the stack's credentials)."""
    # --keep-alive: clients keep their connections (the server closes each after one request
    # otherwise). --data-integrity-etag: ETags from the checksum computed anyway, not a second
    # pass of MD5 over every byte (llog reads no ETag).
    s3_cmd = [
        str(binary), "--port", f"{HOST}:{ports.s3}", "--region", S3_REGION,
        "--health", _S3_HEALTH_PATH, "--keep-alive", "--quiet",
        "posix", "--data-integrity-etag", str(paths.s3_data),
    ]
    s3_env = {**os.environ, "ROOT_ACCESS_KEY_ID": S3_ACCESS_KEY_ID, "ROOT_SECRET_ACCESS_KEY": S3_SECRET_ACCESS_KEY}
    return s3_cmd, s3_env


def _s3_client(port: int):
    return boto3.client(
        "s3",
        endpoint_url=f"http://{HOST}:{port}",
        region_name=S3_REGION,
        aws_access_key_id=S3_ACCESS_KEY_ID,
        aws_secret_access_key=S3_SECRET_ACCESS_KEY,
        config=BotoConfig(
            connect_timeout=PROBE_TIMEOUT_S, read_timeout=10, retries={"total_max_attempts": 1},
            s3={"addressing_style": "path"},
        ),
    )


def s3_problem(ports: StackPorts, bucket: str, prepare: bool) -> str | None:
    """Why the S3 server is not healthy, or None if it is. ``prepare`` creates the bucket and
    round-trips a probe object; otherwise the bucket must exist."""
    if not http_ok(f"http://{HOST}:{ports.s3}{_S3_HEALTH_PATH}"):
        return f"no HTTP 200 from http://{HOST}:{ports.s3}{_S3_HEALTH_PATH}"
    s3 = _s3_client(ports.s3)
    try:
        if not prepare:
            s3.head_bucket(Bucket=bucket)
            return None
        try:
            s3.create_bucket(Bucket=bucket)
        except ClientError as e:
            if e.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
        key, body = f"_llog_stack_probe/{os.getpid()}", b"llog"
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        if s3.get_object(Bucket=bucket, Key=key)["Body"].read() != body:
            return "the S3 probe object read back different bytes"
        s3.delete_object(Bucket=bucket, Key=key)
    except (BotoCoreError, ClientError) as e:
        return f"S3 on {HOST}:{ports.s3}: {e}"
    return None
