"""A real multi-node Ray cluster on one machine, for development and tests.

`ray.init()` gives one node. To exercise what a real cluster does -- `ray job submit` with
a `--working-dir` upload, tasks placed on another raylet by custom resources, objects moved
between object stores -- we start a head and N worker nodes with the ordinary `ray start`
command, each with its own temp dir (session dir, sockets, logs, object store) and its own
ports, so each is a separate raylet exactly as on separate machines.

    from xling.dev.localcluster import start_local_cluster
    c = start_local_cluster(num_workers=1, cpus_per_node=1, tmp_root=Path("/tmp/rc"))
    # ray job submit --address {c.dashboard_url} --working-dir . -- xling run ...
    # env {c.env()} ray status
    c.stop()

`cluster/local-ray-cluster.sh start|stop|status|env` is this module's CLI.

Layout: the head carries `--resources '{"xling-head": 1}'`, each worker
`'{"xling-worker": 1}'`; a task asking for `resources={"xling-worker": 0.01}` therefore runs
on a worker node. Everything the cluster writes lives under `tmp_root` (one `ray start
--temp-dir` per node) plus `cluster.json`, which `stop` reads.

Two things here differ from a plain `ray start`, both because several Ray instances share
this machine (a developer's or a test's own `ray.init()` may run beside the cluster):

* Stopping. `ray stop [--force]` kills every Ray process of the user on the machine,
  whatever cluster it belongs to. We never call it. Every process we start gets
  `XLING_LOCAL_CLUSTER=<random id>` in its environment; Ray passes its environment on to
  everything it spawns (raylets, agents, workers, job drivers -- which Ray starts in new
  sessions, so session ids are not enough), and `stop` signals exactly the processes that
  carry our id: raylets first, then the rest, then GCS, as `ray stop` orders them.
* Loopback. Ray replaces 127.0.0.1 in `--node-ip-address`/`--address` by the machine's
  outward IP and then listens on all interfaces. With `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`
  (the switch macOS uses for local Ray) Ray's node IP is 127.0.0.1 and its gRPC, object
  manager, agents and dashboard listen on loopback only. The same switch makes
  `ray start --address` (a worker node) refuse to run ("multi-node clusters are not
  supported on Windows and OSX"), so worker nodes run the `ray start` click command via
  `python -m xling.dev.localcluster ray-start ...`, which lifts that one check and changes
  nothing else. Clients that talk to GCS directly (`ray status`, `ray.init(address=...)`)
  need the same variable, which is why `LocalCluster.env()` includes it; `ray job submit`
  goes through the dashboard's HTTP API and does not. Pass `loopback=False` to get Ray's
  normal behaviour (outward IP, all interfaces).

Authentication. Ray 2.5x+ turns token auth on for `ray start --head` when
~/.ray/auth_token exists (any earlier `ray.init()` writes one) but not for `ray start
--address`, so the same commands work or fail with "InvalidAuthToken" depending on the
user's home directory. We decide explicitly: by default (`auth="token"`) each cluster gets
its own token in `<tmp_root>/auth_token` (mode 0600) and every node runs with
RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH pointing at it; clients get both from
`env()` (the CLI prints them: `eval "$(cluster/local-ray-cluster.sh start)"`).
`auth="disabled"` sets RAY_AUTH_MODE=disabled everywhere instead.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xling.core.runtime import patient_node_lookup, worker_reuse
from xling.dev.devstore import port_free

__all__ = ["LocalCluster", "LocalClusterError", "loopback_env", "pin_ray_to_loopback", "start_local_cluster", "main"]

MARKER = "XLING_LOCAL_CLUSTER"
LOOPBACK_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
HEAD_RESOURCE, WORKER_RESOURCE = "xling-head", "xling-worker"

# Fixed ports for each node come from [23000, 29999]: above Ray's default worker-port range
# (10002-19999, used by any plain `ray.init()` beside us), below Linux's ephemeral range
# (32768+), and clear of xling.dev.devstore's SeaweedFS ports (20000-22767 and +10000).
_PORT_LO, _PORT_HI = 23000, 29999
_WORKER_PORTS = 100  # per node: every worker process, actor and driver binds one

# Ray puts sockets at <temp_dir>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store
# (~64 characters after temp_dir) and AF_UNIX paths stop at 107 bytes: keep each node's
# temp dir (<root>/head, <root>/w1, ...) at 40 characters or less.
_MAX_TEMP_DIR = 40

_HEAD_PORTS = ("port", "node-manager-port", "object-manager-port", "ray-client-server-port",
               "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
               "runtime-env-agent-port")
_WORKER_NODE_PORTS = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
                      "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")


class LocalClusterError(RuntimeError):
    """The local cluster could not be started or stopped."""


def loopback_env() -> dict[str, str]:
    """Environment that keeps a local Ray instance on 127.0.0.1 (see module docstring)."""
    return {LOOPBACK_VAR: "0"}


def pin_ray_to_loopback() -> None:
    """Make a later `ray.init()` in this process start Ray on 127.0.0.1 only.

    Sets the variable for the processes Ray will spawn and the constant Ray already read
    at import. Call it before `ray.init()`; undo with `os.environ.pop(LOOPBACK_VAR)` and
    `ray._private.ray_constants.ENABLE_RAY_CLUSTER = True` (tests: use monkeypatch).
    """
    os.environ.update(loopback_env())
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


@dataclass
class Node:
    name: str  # "head", "worker1", ...
    temp_dir: str
    ports: dict[str, int]
    session_leader: int  # pid of its `ray start`, which ran in a new session
    log: str  # output of its `ray start`


@dataclass
class LocalCluster:
    address: str  # GCS "127.0.0.1:PORT": ray.init(address=...), ray status --address
    dashboard_url: str  # "http://127.0.0.1:PORT": ray job submit --address
    tmp_root: Path
    cluster_id: str
    loopback: bool = True
    auth: str = "token"  # "token" or "disabled", see module docstring
    nodes: list[Node] = field(default_factory=list)
    short_root: str | None = None  # /tmp/xlrc-* holding the temp dirs when tmp_root is too long

    def env(self) -> dict[str, str]:
        """Variables for clients of this cluster (`ray status`, `ray job submit`, ray.init())."""
        e = {"RAY_ADDRESS": self.address, "RAY_API_SERVER_ADDRESS": self.dashboard_url}
        if self.loopback:
            e.update(loopback_env())
        e.update(_auth_env(self.auth, self.tmp_root))
        return e

    def client_env(self) -> dict[str, str]:
        """os.environ with this cluster's variables, for subprocesses such as `ray job submit`."""
        return {**os.environ, **self.env()}

    def processes(self) -> list[Any]:
        return _owned_processes(self.cluster_id)

    def http_headers(self) -> dict[str, str]:
        """Headers for the dashboard's HTTP API (the token, when auth is on)."""
        if self.auth != "token":
            return {}
        return {"Authorization": "Bearer " + (self.tmp_root / "auth_token").read_text().strip()}

    def alive_node_ids(self) -> list[str]:
        """Node ids the cluster reports ALIVE, from the dashboard's state API (/api/v0/nodes).

        Plain HTTP with our token, rather than ray.util.state.list_nodes: that would take
        its token from this process's environment (and cache it), not from this cluster.
        """
        import urllib.request

        url = f"{self.dashboard_url}/api/v0/nodes?limit=1000&detail=false"
        req = urllib.request.Request(url, headers=self.http_headers())
        with urllib.request.urlopen(req, timeout=10) as r:
            body = json.load(r)
        rows = body["data"]["result"]["result"]
        return sorted(n["node_id"] for n in rows if n.get("state") == "ALIVE")

    def stop(self, grace: float = 10.0, keep_logs: bool = False) -> int:
        """Stop every process of this cluster (and only those). Returns how many were signalled."""
        n = _kill_cluster(self.cluster_id, grace)
        if self.short_root and not keep_logs:
            shutil.rmtree(self.short_root, ignore_errors=True)
        with contextlib.suppress(OSError):
            (self.tmp_root / "cluster.json").unlink()
        return n

    # -- persistence for the CLI --------------------------------------------------------
    def save(self) -> None:
        d = {"address": self.address, "dashboard_url": self.dashboard_url, "tmp_root": str(self.tmp_root),
             "cluster_id": self.cluster_id, "loopback": self.loopback, "auth": self.auth, "short_root": self.short_root,
             "nodes": [vars(n) for n in self.nodes]}
        (self.tmp_root / "cluster.json").write_text(json.dumps(d, indent=2))

    @classmethod
    def load(cls, tmp_root: Path) -> "LocalCluster | None":
        try:
            d = json.loads((Path(tmp_root) / "cluster.json").read_text())
        except (OSError, ValueError):
            return None
        d["tmp_root"] = Path(d["tmp_root"])
        d["nodes"] = [Node(**n) for n in d["nodes"]]
        return cls(**d)


def ray_bin() -> str:
    """The `ray` CLI of this environment (next to the interpreter), else the one on PATH."""
    here = Path(sys.executable).parent / "ray"
    if here.is_file():
        return str(here)
    found = shutil.which("ray")
    if not found:
        raise LocalClusterError("`ray` CLI not found; install ray[default] into this environment")
    return found


# What Ray prints when a raylet did not register with the GCS in time (ray/_private/node.py)
_STARTUP_TIMEOUT = "timed out during startup"
# What _ray_start says when it saw the raylet abort while starting (_raylet_crash)
_RAYLET_DIED = "its raylet died during startup"
# Starts of a whole cluster, when a node does not come up in time.
START_ATTEMPTS = 3


def start_local_cluster(
    num_workers: int = 1,
    cpus_per_node: int = 1,
    tmp_root: Path | None = None,
    *,
    dashboard_port: int | None = None,
    object_store_mb: int = 512,
    loopback: bool = True,
    auth: str = "token",
    timeout: float = 180,
    extra_env: dict[str, str] | None = None,
    dashboard: bool = True,
) -> LocalCluster:
    """Start a head and `num_workers` worker nodes with `ray start`; return once all are ALIVE.

    dashboard_port: None picks a free port (tests); the shell script asks for 8265.
    dashboard: False starts no dashboard (no `ray job submit`, no state API; its two
        processes cost a few CPU-seconds a minute), for a one-node cluster that clients
        join by its GCS address only (the test suite's per-worker node).
    object_store_mb: per node; Ray's default (30% of RAM per node) is a lot on a laptop
        that runs several nodes and SeaweedFS besides.

    A node whose raylet did not register in time (a loaded machine; Ray's own wait is fixed,
    see `patient_node_lookup`), or whose raylet died starting, fails the start; the
    half-started cluster is stopped and the whole start is tried again on fresh ports, up to
    START_ATTEMPTS times in all.
    """
    kw = dict(num_workers=num_workers, cpus_per_node=cpus_per_node, tmp_root=tmp_root,
              dashboard_port=dashboard_port, object_store_mb=object_store_mb,
              loopback=loopback, auth=auth, timeout=timeout, extra_env=extra_env,
              dashboard=dashboard)
    if not dashboard and num_workers:
        raise ValueError("a cluster with worker nodes needs the dashboard: its nodes are "
                         "waited for through the state API")
    for _ in range(START_ATTEMPTS - 1):
        try:
            return _start_local_cluster(**kw)
        except LocalClusterError as e:
            if not _node_did_not_start(e):
                raise
        print("# local Ray cluster: a node did not start in time; retrying on fresh ports",
              file=sys.stderr)
        old = LocalCluster.load(Path(tmp_root).absolute()) if tmp_root else None
        deadline = time.monotonic() + 30
        while old is not None and old.processes() and time.monotonic() < deadline:
            time.sleep(0.5)  # the failed start's processes are on their way out
    return _start_local_cluster(**kw)


def _start_local_cluster(*, num_workers: int, cpus_per_node: int, tmp_root: Path | None,
                         dashboard_port: int | None, object_store_mb: int, loopback: bool,
                         auth: str, timeout: float,
                         extra_env: dict[str, str] | None, dashboard: bool) -> LocalCluster:
    tmp_root = Path(tmp_root or tempfile.mkdtemp(prefix="xling-raycluster-")).absolute()
    tmp_root.mkdir(parents=True, exist_ok=True)
    old = LocalCluster.load(tmp_root)
    if old is not None and old.processes():
        raise LocalClusterError(f"a local cluster from {tmp_root} is still running; stop it first")

    short_root = None
    base = tmp_root
    if len(str(tmp_root / "head")) > _MAX_TEMP_DIR:
        short_root = tempfile.mkdtemp(prefix="xlrc-", dir="/tmp")
        base = Path(short_root)
        with contextlib.suppress(OSError):  # a pointer for humans looking for the logs
            link = tmp_root / "ray-temp"
            if link.is_symlink():
                link.unlink()
            link.symlink_to(base)

    cluster_id = secrets.token_hex(8)
    picker = _PortPicker()
    if dashboard_port is None:
        dashboard_port = picker.one()
    elif not port_free(dashboard_port):
        raise LocalClusterError(f"dashboard port {dashboard_port} is in use (another Ray?); pick another")
    else:
        picker.taken.add(dashboard_port)

    if auth not in ("token", "disabled"):
        raise ValueError(f"auth must be 'token' or 'disabled', not {auth!r}")
    if auth == "token":
        token = tmp_root / "auth_token"
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))  # what `ray get-auth-token --generate` writes
    env = _node_env(cluster_id, loopback, {**_auth_env(auth, tmp_root), **(extra_env or {})},
                    cpus_per_node)
    cluster = LocalCluster(address="", dashboard_url=f"http://127.0.0.1:{dashboard_port}", tmp_root=tmp_root,
                           cluster_id=cluster_id, loopback=loopback, auth=auth, short_root=short_root)
    try:
        head_ports = dict(zip(_HEAD_PORTS, picker.many(len(_HEAD_PORTS))))
        lo = picker.block(_WORKER_PORTS)
        head_ports.update({"min-worker-port": lo, "max-worker-port": lo + _WORKER_PORTS - 1})
        cluster.address = f"127.0.0.1:{head_ports['port']}"
        head_args = [
            "start", "--head",
            "--node-ip-address", "127.0.0.1",
            "--temp-dir", str(base / "head"),
            "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(dashboard_port),
            "--include-dashboard", "true" if dashboard else "false",
            "--num-cpus", str(cpus_per_node),
            "--num-gpus", "0",
            "--resources", json.dumps({HEAD_RESOURCE: 1}),
            "--object-store-memory", str(object_store_mb * 1024 * 1024),
            *_port_args(head_ports),
        ]
        # In loopback mode the head starts through the shim too, for its patient node lookup.
        head_cmd = ([sys.executable, "-m", "xling.dev.localcluster", "ray-start", *head_args]
                    if loopback else [ray_bin(), *head_args])
        cluster.nodes.append(_ray_start("head", head_cmd, base / "head", head_ports,
                                        tmp_root, env, timeout))
        cluster.save()  # from here on `stop` can find what we started
        for i in range(1, num_workers + 1):
            name = f"worker{i}"
            ports = dict(zip(_WORKER_NODE_PORTS, picker.many(len(_WORKER_NODE_PORTS))))
            lo = picker.block(_WORKER_PORTS)
            ports.update({"min-worker-port": lo, "max-worker-port": lo + _WORKER_PORTS - 1})
            args = [
                "start",
                "--address", cluster.address,
                "--node-ip-address", "127.0.0.1",
                "--temp-dir", str(base / f"w{i}"),
                "--num-cpus", str(cpus_per_node),
                "--num-gpus", "0",
                "--resources", json.dumps({WORKER_RESOURCE: 1}),
                "--object-store-memory", str(object_store_mb * 1024 * 1024),
                *_port_args(ports),
            ]
            # See the module docstring: in loopback mode a worker node needs the shim.
            cmd = ([sys.executable, "-m", "xling.dev.localcluster", "ray-start", *args] if loopback
                   else [ray_bin(), *args])
            cluster.nodes.append(_ray_start(name, cmd, base / f"w{i}", ports, tmp_root, env, timeout))
            cluster.save()
        if dashboard:  # else one node, up once `ray start --head` has returned
            _wait_nodes(cluster, num_workers + 1, timeout)
    except BaseException:
        cluster.stop(grace=2, keep_logs=True)
        raise
    return cluster


def _auth_env(auth: str, tmp_root: Path) -> dict[str, str]:
    if auth == "token":
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(Path(tmp_root) / "auth_token")}
    return {"RAY_AUTH_MODE": "disabled"}


def _node_env(cluster_id: str, loopback: bool, extra: dict[str, str] | None,
              cpus_per_node: int) -> dict[str, str]:
    env = dict(os.environ)
    # A caller's RAY_ADDRESS (say, of another cluster) must not leak into our nodes or the
    # drivers they start; jobs get theirs from the job supervisor. Same for another
    # cluster's token.
    for k in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(k, None)
    # This environment's bin/ first, so job entrypoints such as `python ...` or `xling ...`
    # resolve to the interpreter that has xling and ray, not to the system python.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env[MARKER] = cluster_id
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.update({f"RAY_{k}": str(v) for k, v in worker_reuse(cpus_per_node).items()})
    if loopback:
        env.update(loopback_env())
    env.update(extra or {})
    return env


def _port_args(ports: dict[str, int]) -> list[str]:
    return [x for k, v in ports.items() for x in (f"--{k}", str(v))]


def _ray_start(name: str, cmd: list[str], temp_dir: Path, ports: dict[str, int], tmp_root: Path,
               env: dict[str, str], timeout: float) -> Node:
    temp_dir.mkdir(parents=True, exist_ok=True)
    earlier = set(temp_dir.glob("session_*"))  # a failed start's, when the start is retried
    log = tmp_root / f"ray-start-{name}.log"
    with open(log, "ab") as out:
        out.write(f"$ {shlex.join(cmd)}\n".encode())
        out.flush()
        # New session: Ctrl-C in the caller's terminal does not reach the daemons, and they
        # are not killed with the caller's process group.
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_root)
    node = Node(name=name, temp_dir=str(temp_dir), ports=ports, session_leader=proc.pid, log=str(log))
    deadline = time.monotonic() + timeout
    while (rc := proc.poll()) is None:
        crashed = _raylet_crash(temp_dir, earlier)
        if crashed or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            if crashed:  # `ray start` itself would notice only after its own long wait
                raise LocalClusterError(f"`ray start` for {name} failed: {_RAYLET_DIED}: "
                                        f"{crashed}")
            raise LocalClusterError(f"`ray start` for {name} did not finish in {timeout:.0f}s\n{_tail(log)}")
        time.sleep(0.5)
    if rc != 0:
        raise LocalClusterError(f"`ray start` for {name} failed (exit {rc})\n{_tail(log)}")
    return node


def _node_did_not_start(e: LocalClusterError) -> bool:
    """A start that failed because a node did not come up (worth a fresh try), not because
    of the configuration or a port in use."""
    return _STARTUP_TIMEOUT in str(e) or _RAYLET_DIED in str(e)


def _raylet_crash(temp_dir: Path, earlier: set[Path] = frozenset()) -> str | None:
    """The raylet's fatal line, if it died starting (sessions in `earlier` are not this
    start's). Seen on a loaded machine: the raylet gives its dashboard agent a fixed 15 s
    to write its port file and aborts after that ("Timed out waiting for file
    .../dashboard_agent_listen_port_...")."""
    for session in set(Path(temp_dir).glob("session_*")) - set(earlier):
        err = session / "logs" / "raylet.err"
        with contextlib.suppress(OSError):
            for line in err.read_text(errors="replace").splitlines():
                if "Check failed" in line or "Timed out waiting for file" in line:
                    return line.strip()[-300:]
    return None


def _wait_nodes(cluster: LocalCluster, n: int, timeout: float) -> None:
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            if len(cluster.alive_node_ids()) >= n:
                return
        except Exception as e:  # dashboard still starting
            last = e
        time.sleep(0.5)
    raise LocalClusterError(f"{n} nodes not ALIVE after {timeout:.0f}s (last error: {last!r})")


# -- ports ------------------------------------------------------------------------------


class _PortPicker:
    def __init__(self) -> None:
        self.taken: set[int] = set()
        self.rng = random.Random()

    def block(self, n: int) -> int:
        """First port of n consecutive free ones."""
        for _ in range(200):
            lo = self.rng.randrange(_PORT_LO, _PORT_HI - n)
            rng = range(lo, lo + n)
            if not self.taken.intersection(rng) and all(port_free(p) for p in rng):
                self.taken.update(rng)
                return lo
        raise LocalClusterError(f"no {n} consecutive free ports in {_PORT_LO}-{_PORT_HI}")

    def one(self) -> int:
        return self.block(1)

    def many(self, n: int) -> list[int]:
        return [self.one() for _ in range(n)]


# -- finding and stopping our processes -------------------------------------------------


def _owned_processes(cluster_id: str) -> list[Any]:
    """Every live process of the cluster `cluster_id`, and no other.

    Three nets, because no single one catches everything:
    * the marker: /proc/<pid>/environ contains XLING_LOCAL_CLUSTER=<id>. Not enough alone:
      processes that retitle themselves (setproctitle: "ray::IDLE", "ray::DashboardAgent",
      the dashboard's module processes) may overwrite that memory, and then it reads as
      their title;
    * sessions: every `ray start` runs in a new session, so the daemons it forks share its
      session id; we take the sessions of marked processes (which proves they are ours,
      whereas a recorded session id could have been reused after the cluster died);
    * descent: children of anything above (workers of a raylet, a job driver, which Ray
      starts in a session of its own, and whatever that driver starts).
    """
    import psutil

    me = os.getpid()
    needle = f"{MARKER}={cluster_id}".encode() + b"\0"
    procs: dict[int, Any] = {}
    marked: set[int] = set()
    for p in psutil.process_iter(["pid", "ppid", "status"]):
        if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        procs[p.pid] = p
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                if needle in f.read() + b"\0":
                    marked.add(p.pid)
        except OSError:
            continue

    def sid(pid: int) -> int | None:
        try:
            return os.getsid(pid)
        except OSError:
            return None

    sessions = {sid(pid) for pid in marked} - {None, sid(me)}
    owned = marked | {pid for pid in procs if sid(pid) in sessions}
    children: dict[int, list[int]] = {}
    for pid, p in procs.items():
        children.setdefault(p.info["ppid"], []).append(pid)
    todo = list(owned)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in owned:
                owned.add(c)
                todo.append(c)
    return [procs[pid] for pid in sorted(owned)]


def _kill_cluster(cluster_id: str, grace: float) -> int:
    import psutil

    procs = _owned_processes(cluster_id)
    if not procs:
        return 0

    def name(p: Any) -> str:
        try:
            return p.name()
        except psutil.Error:
            return ""

    # The order `ray stop` uses: raylets first (else fate-sharing agents complain and exit
    # noisily), GCS last (else the others fail their health checks and exit with errors).
    raylets = [p for p in procs if name(p) == "raylet"]
    gcs = [p for p in procs if name(p) == "gcs_server"]
    rest = [p for p in procs if p not in raylets and p not in gcs]
    for group in (raylets, rest, gcs):
        for p in group:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(group, timeout=max(grace / 3, 0.5))
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=5)
    # Anything spawned while we were stopping (a worker the raylet started on its way out).
    for _ in range(3):
        late = _owned_processes(cluster_id)
        if not late:
            break
        for p in late:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(late, timeout=5)
    left = _owned_processes(cluster_id)
    if left:
        raise LocalClusterError(f"processes of cluster {cluster_id} survived SIGKILL: {[p.pid for p in left]}")
    return len(procs)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


# -- CLI --------------------------------------------------------------------------------


def _ray_start_shim(args: list[str]) -> int:
    """`ray start ARGS` with the Windows/OSX multi-node check lifted (loopback worker nodes).

    Ray's CLI module reads `ray_constants.ENABLE_RAY_CLUSTER` twice: to abort a worker-node
    start, and to print a hint. We give that module a copy of the constants with the flag
    on, while the rest of Ray (services.get_node_ip_address) keeps reading the real module,
    where RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 turned it off: node IP 127.0.0.1.
    """
    import types

    import ray._private.ray_constants as ray_constants
    import ray.scripts.scripts as scripts

    if not hasattr(scripts, "ray_constants") or not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        raise LocalClusterError("this Ray version has no ENABLE_RAY_CLUSTER switch; use loopback=False")
    shim = types.ModuleType("ray_constants_for_ray_start")
    shim.__dict__.update(ray_constants.__dict__)
    shim.ENABLE_RAY_CLUSTER = True
    scripts.ray_constants = shim
    patient_node_lookup()
    sys.argv = ["ray", *args]
    return scripts.main()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["ray-start"]:  # internal, see _ray_start_shim
        return _ray_start_shim(argv[1:]) or 0

    p = argparse.ArgumentParser(prog="python -m xling.dev.localcluster",
                                description="Local multi-node Ray cluster (head + workers) on this machine.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--root", default=".xling-cache/ray-cluster", help="temp dirs, logs and cluster.json")
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--cpus-per-node", type=int, default=1)
    s.add_argument("--dashboard-port", type=int, default=8265, help="0 = pick a free port")
    s.add_argument("--object-store-mb", type=int, default=512)
    s.add_argument("--no-loopback", action="store_true", help="Ray's default: outward IP, all interfaces")
    s.add_argument("--auth", choices=("token", "disabled"), default="token",
                   help="token: a per-cluster token in ROOT/auth_token (clients need `env`)")
    for name in ("stop", "status", "env"):
        q = sub.add_parser(name)
        q.add_argument("--root", default=".xling-cache/ray-cluster")
    a = p.parse_args(argv)
    root = Path(a.root).absolute()

    try:
        if a.cmd == "start":
            c = start_local_cluster(a.workers, a.cpus_per_node, root, dashboard_port=a.dashboard_port or None,
                                    object_store_mb=a.object_store_mb, loopback=not a.no_loopback, auth=a.auth)
            print(f"# local Ray cluster: {len(c.nodes)} nodes, dashboard {c.dashboard_url}", file=sys.stderr)
            print(f"# ray job submit --address {c.dashboard_url} --working-dir . -- xling run --config ...",
                  file=sys.stderr)
            sys.stdout.write("".join(f"export {k}={shlex.quote(v)}\n" for k, v in c.env().items()))
            return 0
        c = LocalCluster.load(root)
        if c is None:
            print(f"no local cluster recorded in {root}", file=sys.stderr)
            return 1
        if a.cmd == "stop":
            n = c.stop()
            print(f"stopped {n} processes of cluster {c.cluster_id}", file=sys.stderr)
            return 0
        if a.cmd == "env":
            sys.stdout.write("".join(f"export {k}={shlex.quote(v)}\n" for k, v in c.env().items()))
            return 0
        # status: `ray status` against our GCS (needs the loopback variable, see docstring)
        print(f"# {len(c.processes())} processes, dashboard {c.dashboard_url}", file=sys.stderr)
        return subprocess.call([ray_bin(), "status", "--address", c.address], env=c.client_env())
    except LocalClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
