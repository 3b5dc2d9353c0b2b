"""Bad input is refused before any work starts, with a message a user can act on.

Each case runs the real `xling` command line and checks its exit code, its message, and
that nothing was written to the run root.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from xling.core.store import RunStore, StoreError, parse_run_root

ROOT = Path(__file__).resolve().parents[2]


def xling(*args, env=None):
    return subprocess.run([sys.executable, "-m", "xling.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def config(tmp_path, extra="", langs="[fi, sw]", run_root=None):
    p = tmp_path / "c.yaml"
    p.write_text(f"""
name: bad
run_root: {run_root or tmp_path / 'run'}
ingest:
  tokenizer: {tmp_path}
  corpora:
    - name: m
      path: {ROOT}/data/demo/mrtydi/{{lang}}.jsonl.gz
      langs: {langs}
{extra}""")
    return p


def refused(res, *needles):
    assert res.returncode == 2, res.stdout + res.stderr
    for n in needles:
        assert n in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_unknown_key(tmp_path):
    res = xling("ingest", "--config", str(config(tmp_path, extra="  shard: 3\n")))
    refused(res, "c.yaml", "ingest.shard", "unknown key", "did you mean 'shards'")
    assert not (tmp_path / "run").exists()


def test_unknown_language(tmp_path):
    res = xling("ingest", "--config", str(config(tmp_path, langs="[fi, fr_FR, sw]")))
    refused(res, "ingest.corpora[0].langs", "fr_FR", "xling/tasks/languages.py")
    assert not (tmp_path / "run").exists()


def test_missing_input_files(tmp_path):
    res = xling("ingest", "--config", str(config(tmp_path)), "ingest.corpora.0.langs=[fi,yo]")
    refused(res, "ingest.corpora[0].path", "no files match", "yo")


@pytest.mark.parametrize("uri, needle", [
    ("gs://bucket/run", "scheme 'gs://' is not supported"),
    ("s3://Bad_Bucket/run", "not a valid S3 bucket name"),
    ("s3:///run", "not a valid S3 bucket name"),
])
def test_bad_run_root_uri(tmp_path, uri, needle):
    res = xling("ingest", "--config", str(config(tmp_path)), f"run_root={uri}", "--dry-run")
    refused(res, needle)
    with pytest.raises(StoreError, match=needle.split("'")[0]):
        parse_run_root(uri)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_s3_endpoint(tmp_path):
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{_free_port()}", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "y", "AWS_REGION": "us-east-1"}
    res = xling("ingest", "--config", str(config(tmp_path, run_root="s3://xling-test/r")), env=env)
    refused(res, "cannot reach the S3 endpoint", "AWS_ENDPOINT_URL")


def test_wrong_credentials(tmp_path, s3_server):
    env = {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    res = xling("ingest", "--config", str(config(tmp_path, run_root="s3://xling-test/r")), env=env)
    refused(res, "rejected the credentials", "AWS_SECRET_ACCESS_KEY")


def test_missing_bucket(tmp_path, s3_server):
    res = xling("ingest", "--config", str(config(tmp_path, run_root="s3://no-such-bucket/r")),
                env=s3_server.env())
    refused(res, "bucket 'no-such-bucket' does not exist")


def test_store_round_trip_over_s3(s3_server, monkeypatch):
    import pyarrow as pa

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    store = RunStore("s3://xling-test/roundtrip")
    store.check()
    store.write_json("a/b.json", {"x": 1})
    store.write_parquet("a/p.parquet", pa.table({"x": [1, 2]}))
    assert store.read_json("a/b.json") == {"x": 1}
    assert store.read_parquet("a/p.parquet")["x"].to_pylist() == [1, 2]
    assert store.list("a") == ["a/b.json", "a/p.parquet"]
    assert store.list_dirs() == ["a"]
    store.move("a/p.parquet", "a/q.parquet")
    assert store.list("a") == ["a/b.json", "a/q.parquet"] and store.parquet_rows("a/q.parquet") == 2
    store.delete_tree("a")
    assert store.list("a") == [] and not store.exists("a/b.json")


_NO_AWS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
           "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


@pytest.mark.parametrize("aws, needles", [
    # No credentials anywhere (env, ~/.aws, instance metadata): refused before any request.
    ({}, ["no S3 credentials", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"]),
    ({"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"},
     ["cannot reach the S3 endpoint", "AWS_ENDPOINT_URL"]),
], ids=["no-credentials", "unreachable"])
def test_dry_run_on_s3_checks_the_store_first(tmp_path, aws, needles):
    """`--dry-run` reads manifests from the store: one line naming the fix, in seconds."""
    env = {k: v for k, v in os.environ.items() if k not in _NO_AWS}
    env.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{_free_port()}", AWS_REGION="us-east-1",
               AWS_EC2_METADATA_DISABLED="true",  # never ask 169.254.169.254 for credentials
               AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    env.update(aws)
    res = subprocess.run([sys.executable, "-m", "xling.cli", "run", "--dry-run", "--config",
                          str(config(tmp_path, run_root="s3://xling-test/r"))],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    refused(res, *needles)
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.parametrize("endpoint", ["127.0.0.1:9", ""])
def test_malformed_s3_endpoint(monkeypatch, endpoint):
    """botocore's ValueError for an endpoint without a scheme (or set but empty) is a StoreError."""
    for k in _NO_AWS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StoreError, match="Invalid endpoint.*AWS_ENDPOINT_URL to a full URL"):
        RunStore("s3://xling-test/r").check(write=False)
