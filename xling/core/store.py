"""The run store: where every stage reads its inputs and commits its outputs.

`run_root` is a local directory or `s3://bucket/prefix`. S3 is configured only through the
standard AWS variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_REGION), so the same code talks to AWS S3, MinIO, SeaweedFS or R2. Small objects
(manifests, shard markers) go through boto3; Parquet goes through pyarrow's filesystem so that
Ray Data can read and write it directly.

Paths given to a RunStore are always relative to the run root and use "/".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
import time
import uuid
import functools
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class StoreError(RuntimeError):
    """The run store is misconfigured or unreachable; the message says what to fix."""


def parse_run_root(uri: str) -> tuple[str, str, str]:
    """Split a run_root into (scheme, bucket-or-"", path). Raises StoreError on bad URIs."""
    uri = str(uri).strip()
    if not uri:
        raise StoreError("run_root is empty: give a local directory or s3://bucket/prefix")
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", uri)
    if not m:
        return "file", "", str(Path(uri).expanduser().resolve())
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme == "file":
        return "file", "", str(Path(rest).resolve())
    if scheme not in ("s3", "s3a"):
        raise StoreError(
            f"run_root '{uri}': scheme '{scheme}://' is not supported. Use a local path or "
            f"s3://bucket/prefix (S3-compatible stores such as MinIO, SeaweedFS and R2 are reached "
            f"through AWS_ENDPOINT_URL)."
        )
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket or ""):
        raise StoreError(
            f"run_root '{uri}': '{bucket}' is not a valid S3 bucket name (3-63 characters: "
            f"lowercase letters, digits, '.' and '-'). Write it as s3://bucket/prefix."
        )
    return "s3", bucket, prefix.strip("/")


S3_ATTEMPTS_ENV = "XLING_S3_MAX_ATTEMPTS"
DEFAULT_S3_ATTEMPTS = 8
CHECK_ATTEMPTS = 3  # RunStore.check, before any work
log = logging.getLogger("xling.store")


def s3_max_attempts() -> int:
    """Attempts per S3 request, the first included, for boto3 and pyarrow alike: enough for
    a throttling store (503 SlowDown), bounded so that a store that stays down fails the
    cell (standard retry mode: jittered exponential backoff up to 20 s per wait)."""
    value = os.environ.get(S3_ATTEMPTS_ENV, "").strip()
    if not value:
        return DEFAULT_S3_ATTEMPTS
    if not value.isdigit() or int(value) < 1:
        raise StoreError(f"{S3_ATTEMPTS_ENV}={value!r}: give a number of attempts, 1 or more")
    return int(value)


def _log_retry(limit: int, attempts=None, caught_exception=None, response=None,
               operation=None, request_dict=None, **_) -> None:
    """botocore's needs-retry hook: one log line per failed attempt of an S3 request
    (pyarrow's retries run in the AWS C++ SDK, out of Python's reach)."""
    status = (response[0].status_code if response and response[0] is not None else None)
    if caught_exception is None and (status is None or (status < 500 and status != 429)):
        return
    what = (f"{type(caught_exception).__name__}: {caught_exception}" if caught_exception
            else f"HTTP {status} {((response[1] or {}).get('Error') or {}).get('Code', '')}")
    log.warning("S3 %s %s: attempt %s of %s failed (%s)", getattr(operation, "name", "?"),
                (request_dict or {}).get("url_path", ""), attempts, limit, what)


# pyarrow errors (AWS C++ SDK) worth another try once the SDK's own retries are over or did
# not apply: Ray Data's `retried_io_errors`. INTERNAL_FAILURE includes a ranged GET whose
# 503/500 error body overflowed the read's buffer ("Failed to flush response stream"),
# which the SDK does not retry (seen under tests/faults/test_s3_faults.py).
TRANSIENT_PYARROW = ("AWS Error INTERNAL_FAILURE", "AWS Error NETWORK_CONNECTION",
                     "AWS Error SLOW_DOWN", "AWS Error SERVICE_UNAVAILABLE",
                     "AWS Error UNKNOWN (HTTP status 503)", "AWS Error UNKNOWN (HTTP status 500)")
PYARROW_ROUNDS = 3  # RunStore.retrying: rounds of the SDK's own attempts


def s3_settings() -> dict[str, str | None]:
    """The standard AWS variables that decide where S3 requests go."""
    return {
        "endpoint": os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
        "region": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        "access_key": os.environ.get("AWS_ACCESS_KEY_ID"),
        "secret_key": os.environ.get("AWS_SECRET_ACCESS_KEY"),
        "session_token": os.environ.get("AWS_SESSION_TOKEN"),
    }


class RunStore:
    """A run root, local or S3, with atomic small writes and Parquet helpers."""

    def __init__(self, uri: str):
        self.uri = str(uri)
        self.scheme, self.bucket, self.prefix = parse_run_root(self.uri)

    def __reduce__(self):  # ship to Ray workers as the URI; clients are rebuilt there
        return (RunStore, (self.uri,))

    def __repr__(self) -> str:
        return f"RunStore({self.url()!r})"

    @property
    def is_s3(self) -> bool:
        return self.scheme == "s3"

    # ---- naming --------------------------------------------------------------------
    def key(self, rel: str = "") -> str:
        """Object key (S3) or absolute path (local) for a path relative to the root."""
        rel = rel.strip("/")
        if self.is_s3:
            return "/".join(p for p in (self.prefix, rel) if p)
        return os.path.join(self.prefix, rel) if rel else self.prefix

    def fs_path(self, rel: str = "") -> str:
        """The path pyarrow's filesystem (and so Ray Data) uses for `rel`."""
        return f"{self.bucket}/{self.key(rel)}".rstrip("/") if self.is_s3 else self.key(rel)

    def url(self, rel: str = "") -> str:
        if self.is_s3:
            return f"s3://{self.bucket}/{self.key(rel)}".rstrip("/")
        return self.key(rel)

    # ---- clients -------------------------------------------------------------------
    @cached_property
    def fs(self) -> pafs.FileSystem:
        if not self.is_s3:
            return pafs.LocalFileSystem()
        s = s3_settings()
        kw: dict[str, Any] = {"region": s["region"]}
        if s["endpoint"]:
            scheme, _, host = s["endpoint"].partition("://")
            kw.update(endpoint_override=host.rstrip("/") or scheme, scheme=scheme if host else "https")
        if s["access_key"]:
            kw.update(access_key=s["access_key"], secret_key=s["secret_key"],
                      session_token=s["session_token"])
        # Fail in seconds, not minutes, when the endpoint is down.
        kw.update(connect_timeout=5, request_timeout=60,
                  retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=s3_max_attempts()))
        return pafs.S3FileSystem(**kw)

    @cached_property
    def s3(self):
        attempts = s3_max_attempts()
        client = self._boto3(attempts)
        client.meta.events.register("needs-retry.s3", functools.partial(_log_retry, attempts))
        return client

    def _boto3(self, attempts: int):
        import boto3
        from botocore.config import Config

        s = s3_settings()
        return boto3.client(
            "s3",
            endpoint_url=s["endpoint"],
            region_name=s["region"],
            config=Config(connect_timeout=5, read_timeout=60,
                          retries={"total_max_attempts": attempts, "mode": "standard"},
                          s3={"addressing_style": "path"}),
        )

    def retrying(self, what: str, fn):
        """`fn()` (pyarrow I/O on this store), again after a logged backoff when S3 fails it
        with a transient error, at most PYARROW_ROUNDS times; local stores call it once."""
        for round_ in range(1, PYARROW_ROUNDS + 1):
            try:
                return fn()
            except OSError as e:
                if (not self.is_s3 or round_ == PYARROW_ROUNDS
                        or not any(t in str(e) for t in TRANSIENT_PYARROW)):
                    raise
                log.warning("S3 %s: round %d of %d failed (%s), retrying", what, round_,
                            PYARROW_ROUNDS, str(e).splitlines()[0])
                time.sleep(random.uniform(0.5, 1.0) * 2 ** round_)

    # ---- checks --------------------------------------------------------------------
    def check(self, write: bool = True) -> None:
        """Fail fast, before any work, if the root cannot be reached or written."""
        if not self.is_s3:
            try:
                Path(self.prefix).mkdir(parents=True, exist_ok=True)
                if write:
                    probe = Path(self.prefix) / f".xling-probe-{uuid.uuid4().hex}"
                    probe.write_bytes(b"ok")
                    probe.unlink()
            except OSError as e:
                raise StoreError(f"run_root '{self.uri}' is not a writable directory: {e}") from None
            return
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
        )

        endpoint = s3_settings()["endpoint"] or "AWS S3"
        try:  # a probe's few attempts, unlogged: a store that is down fails in one line
            probe_client = self._boto3(CHECK_ATTEMPTS)
        except ValueError as e:  # botocore: "Invalid endpoint: ..." (no scheme, or set but empty)
            raise StoreError(
                f"run_root '{self.uri}': {e}. Set AWS_ENDPOINT_URL to a full URL such as "
                f"http://127.0.0.1:8333, or unset it (and AWS_ENDPOINT_URL_S3) for AWS S3."
            ) from None
        try:
            probe_client.head_bucket(Bucket=self.bucket)
            if write:
                probe = self.key(f".xling-probe-{uuid.uuid4().hex}")
                probe_client.put_object(Bucket=self.bucket, Key=probe, Body=b"ok")
                probe_client.delete_object(Bucket=self.bucket, Key=probe)
        except NoCredentialsError:
            raise StoreError(
                f"run_root '{self.uri}': no S3 credentials. Set AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for a non-AWS store)."
            ) from None
        except EndpointConnectionError as e:
            raise StoreError(
                f"run_root '{self.uri}': cannot reach the S3 endpoint {endpoint} ({e}). Check "
                f"AWS_ENDPOINT_URL and that the server is running (for a local one: "
                f"cluster/local-s3.sh start)."
            ) from None
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("404", "NoSuchBucket"):
                raise StoreError(
                    f"run_root '{self.uri}': bucket '{self.bucket}' does not exist at {endpoint}. "
                    f"Create it first (aws s3 mb s3://{self.bucket} --endpoint-url {endpoint})."
                ) from None
            if status in (401, 403) or code in ("403", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                                                 "AccessDenied"):
                raise StoreError(
                    f"run_root '{self.uri}': {endpoint} rejected the credentials ({code or status}). "
                    f"Check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and that they may read and "
                    f"write bucket '{self.bucket}'."
                ) from None
            raise StoreError(f"run_root '{self.uri}': S3 error {code} at {endpoint}: {e}") from None
        except BotoCoreError as e:
            raise StoreError(
                f"run_root '{self.uri}': cannot use the S3 endpoint {endpoint}: {e}. Check "
                f"AWS_ENDPOINT_URL (a full URL such as http://127.0.0.1:8333)."
            ) from None

    # ---- small objects -------------------------------------------------------------
    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a whole object; readers see the old object or the new one, never a part."""
        if self.is_s3:
            self.s3.put_object(Bucket=self.bucket, Key=self.key(rel), Body=data)
            return
        path = Path(self.key(rel))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def read_bytes(self, rel: str) -> bytes:
        if self.is_s3:
            try:
                return self.s3.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"].read()
            except self.s3.exceptions.NoSuchKey:
                raise FileNotFoundError(self.url(rel)) from None
        return Path(self.key(rel)).read_bytes()

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_bytes(rel, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_bytes(rel))

    def read_json_or_none(self, rel: str) -> Any:
        try:
            return self.read_json(rel)
        except FileNotFoundError:
            return None

    def exists(self, rel: str) -> bool:
        if self.is_s3:
            from botocore.exceptions import ClientError

            try:
                self.s3.head_object(Bucket=self.bucket, Key=self.key(rel))
                return True
            except ClientError as e:
                if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                    return False
                raise
        return os.path.exists(self.key(rel))

    def list(self, rel: str = "") -> list[str]:
        """All files below `rel`, as paths relative to the run root, sorted."""
        base = self.key(rel)
        if self.is_s3:
            prefix = base.rstrip("/") + "/" if base else ""
            out = []
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                out += [o["Key"] for o in page.get("Contents", [])]
            strip = len(self.prefix) + 1 if self.prefix else 0
            return sorted(k[strip:] for k in out)
        if not os.path.isdir(base):
            return []
        out = []
        for dirpath, _, files in os.walk(base):
            for f in files:
                if not f.startswith(".xling-probe") and not (f.startswith(".") and ".json." in f):
                    out.append(os.path.relpath(os.path.join(dirpath, f), self.prefix))
        return sorted(p.replace(os.sep, "/") for p in out)

    def list_dirs(self, rel: str = "") -> list[str]:
        """Immediate sub-directories (S3: common prefixes) of `rel`, by name."""
        base = self.key(rel)
        if self.is_s3:
            prefix = base.rstrip("/") + "/" if base else ""
            names = set()
            for page in self.s3.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
                names |= {p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])}
            return sorted(names)
        if not os.path.isdir(base):
            return []
        return sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))

    def delete(self, rel: str) -> None:
        if self.is_s3:
            self.s3.delete_object(Bucket=self.bucket, Key=self.key(rel))
        elif os.path.exists(self.key(rel)):
            os.remove(self.key(rel))

    def delete_tree(self, rel: str) -> None:
        if self.is_s3:
            keys = [self.key(r) for r in self.list(rel)]
            for i in range(0, len(keys), 1000):
                self.s3.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})
        else:
            shutil.rmtree(self.key(rel), ignore_errors=True)

    def move(self, src: str, dst: str) -> None:
        """Rename within the store: atomic locally, server-side copy + delete on S3."""
        if self.is_s3:
            self.s3.copy_object(Bucket=self.bucket, Key=self.key(dst),
                                CopySource={"Bucket": self.bucket, "Key": self.key(src)})
            self.s3.delete_object(Bucket=self.bucket, Key=self.key(src))
        else:
            Path(self.key(dst)).parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.key(src), self.key(dst))

    # ---- folders (model conversions, Lucene indexes) -------------------------------
    def upload_tree(self, local: str | Path, rel: str, marker: str, info: dict) -> dict:
        """Copy a local folder to `rel`, then write `rel/marker` (info + file list) last.

        A reader trusts a folder only once its marker exists, so a killed upload is redone.
        """
        local = Path(local)
        files = sorted(str(p.relative_to(local)).replace(os.sep, "/") for p in local.rglob("*")
                       if p.is_file() and p.name != "write.lock")
        for name in files:
            self.write_bytes(f"{rel}/{name}", (local / name).read_bytes())
        info = {**info, "files": files}
        self.write_json(f"{rel}/{marker}", info)
        return info

    def fetch_tree(self, rel: str, marker: str) -> str:
        """A local folder holding the store's copy of `rel` (cached per node by its marker).

        A local run root is used in place. From S3 the files are copied once into
        $XLING_CACHE/store/<hash> and reused while the marker is unchanged.
        """
        if not self.is_s3:
            return self.key(rel)
        info = self.read_json(f"{rel}/{marker}")
        cache = Path(os.environ.get("XLING_CACHE", ".xling-cache")).resolve() / "store"
        dest = cache / hashlib.sha256(self.url(rel).encode()).hexdigest()[:16]
        try:
            if json.loads((dest / marker).read_text()) == info:
                return str(dest)
        except (OSError, ValueError):
            pass
        tmp = cache / f".tmp-{uuid.uuid4().hex}"
        for name in info["files"]:
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(self.read_bytes(f"{rel}/{name}"))
        (tmp / marker).write_text(json.dumps(info))
        shutil.rmtree(dest, ignore_errors=True)
        try:
            os.replace(tmp, dest)  # another actor on this node may have won the race: fine
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        return str(dest)

    # ---- parquet -------------------------------------------------------------------
    def write_parquet(self, rel: str, table: pa.Table) -> None:
        if not self.is_s3:
            Path(self.key(rel)).parent.mkdir(parents=True, exist_ok=True)
        # An upload that failed completed nothing (S3 multipart), so writing again is safe.
        self.retrying(f"write {self.url(rel)}", lambda: pq.write_table(
            table, self.fs_path(rel), filesystem=self.fs, compression="zstd"))

    def read_parquet(self, rels: list[str] | str, columns: list[str] | None = None) -> pa.Table:
        """Files concatenated; `columns` missing from a file (e.g. an empty shard's part,
        which has only `error`) come back as nulls rather than failing the read."""
        rels = [rels] if isinstance(rels, str) else list(rels)

        def read() -> pa.Table:
            files = (pq.ParquetFile(self.fs_path(r), filesystem=self.fs) for r in rels)
            return concat_parts(files, columns)

        return self.retrying(f"read {self.url(rels[0]) if rels else ''} ({len(rels)} files)",
                             read)

    def parquet_rows(self, rel: str) -> int:
        def rows() -> int:
            with self.fs.open_input_file(self.fs_path(rel)) as f:
                return pq.ParquetFile(f).metadata.num_rows

        return self.retrying(f"read {self.url(rel)}", rows)


def concat_parts(files: Iterable[pq.ParquetFile], columns: list[str] | None = None) -> pa.Table:
    """Parquet files as one table (RunStore.read_parquet), `columns` a file lacks as nulls."""
    tables = []
    for f in files:
        if columns is None:
            tables.append(f.read())
            continue
        have = [c for c in columns if c in f.schema_arrow.names]
        t = f.read(columns=have)
        if len(have) < len(columns):
            if t.num_rows:
                for c in columns:
                    if c not in have:
                        t = t.append_column(c, pa.nulls(t.num_rows))
            else:
                continue  # an empty file says nothing about types
        tables.append(t.select(columns))
    if not tables:
        return pa.table({c: pa.array([], pa.string()) for c in columns or []})
    return pa.concat_tables(tables, promote_options="default")
