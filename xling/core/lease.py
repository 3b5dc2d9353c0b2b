"""One driver per run root: the lease a driver holds while it runs stages.

`{run_root}/_lease.json` names the driver that owns the run root: run id, host, pid (and
the pid's start time, so a reused pid is not taken for the holder), command, start time,
last heartbeat and the holder's time-to-live. It is written atomically and only ever
replaced by a conditional write:

- local (and shared POSIX file systems): created with `link(tmp, lease)`, which fails if a
  lease exists; taken over by renaming the old lease away (only one driver's rename
  succeeds) and creating a new one;
- S3: `PutObject` with `If-None-Match: *` to create, `If-Match: <etag>` to take over and to
  beat, `DeleteObject` with `If-Match` to release (AWS S3 since 2024, SeaweedFS, MinIO,
  R2). A store that ignores these headers is detected with a probe object; there the lease
  is written, read back after `SETTLE_S` and kept only if it is still ours, which leaves a
  window: two drivers whose existence checks fall within `SETTLE_S` of each other's write
  may both start (docs/design.md, "One driver per run root").

A second driver refuses to start (`LeaseHeld`, one line: who, since when, what to do). It
takes the lease over, and says so, when the holder is gone: a holder on this host whose
process no longer exists, or any holder whose heartbeat is older than its TTL
(`XLING_LEASE_TTL`, default 90 s; beats every TTL/6). `--takeover` takes it at once. A
driver that finds its lease taken at a heartbeat stops (KeyboardInterrupt in the main
thread: committed shards are kept), so two drivers never keep writing the same cells.
"""

from __future__ import annotations

import _thread
import atexit
import datetime as _dt
import json
import logging
import os
import shlex
import socket
import sys
import threading
import time
import uuid

from xling.core.store import RunStore, StoreError

LEASE = "_lease.json"
TTL_ENV = "XLING_LEASE_TTL"
DEFAULT_TTL_S = 90.0
SETTLE_S = 1.0  # read-back delay on a store without conditional writes

logger = logging.getLogger("xling.lease")
_HELD: dict[str, "RunLease"] = {}  # this process's leases, by run root
_CONDITIONAL: dict[tuple, bool] = {}  # (endpoint, bucket) -> store honours If-(None-)Match


class LeaseHeld(StoreError):
    """Another driver holds the run root; the message says who, since when, and what to do."""


def _now() -> float:
    return time.time()


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds")


def _proc_start(pid: int) -> str | None:
    """The process's start time (Linux clock ticks since boot): a pid plus this is unique."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _process_gone(info: dict) -> bool:
    """The holder ran on this host and its process is gone (or the pid is another's now)."""
    if info.get("host") != socket.gethostname() or not info.get("pid"):
        return False
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    started = info.get("proc_start")
    return bool(started) and _proc_start(int(info["pid"])) not in (None, started)


def ttl_s() -> float:
    value = os.environ.get(TTL_ENV, "")
    try:
        return float(value) if value.strip() else DEFAULT_TTL_S
    except ValueError:
        raise StoreError(f"{TTL_ENV}={value!r}: give the lease's time-to-live in seconds") from None


def describe(info: dict, now: float | None = None) -> str:
    """`run X (pid P on H, `cmd`) since T, last heartbeat N s ago`."""
    age = (now or _now()) - float(info.get("heartbeat", 0))
    return (f"run {info.get('run_id')} (pid {info.get('pid')} on {info.get('host')}, "
            f"`{info.get('command')}`) since {_iso(float(info.get('started', 0)))}, "
            f"last heartbeat {age:.0f}s ago")


class _Backend:
    """Conditional create / replace / delete of the lease object; `tag` identifies the
    version a caller read (S3: ETag; local: the lease's token)."""

    def __init__(self, store: RunStore):
        self.store = store

    def read(self) -> tuple[dict, str] | None:
        raise NotImplementedError

    def create(self, body: bytes) -> str | None:
        """Write the lease if none exists; its tag, or None if one exists."""
        raise NotImplementedError

    def replace(self, body: bytes, tag: str) -> str | None:
        """Write the lease if it is still version `tag`; the new tag, or None."""
        raise NotImplementedError

    def delete(self, tag: str) -> None:
        raise NotImplementedError


class _LocalBackend(_Backend):
    @property
    def path(self) -> str:
        return self.store.key(LEASE)

    def read(self):
        try:
            with open(self.path, "rb") as f:
                info = json.loads(f.read())
        except FileNotFoundError:
            return None
        except ValueError:  # not ours to parse: a foreign or damaged file
            raise StoreError(f"{self.path} is not an xling lease: remove it if no driver "
                             "is running on this run root") from None
        return info, info.get("token", "")

    def _tmp(self, body: bytes) -> str:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(body)
        return tmp

    def create(self, body):
        tmp = self._tmp(body)
        try:
            os.link(tmp, self.path)  # atomic, and fails if a lease exists (NFS too)
        except FileExistsError:
            return None
        finally:
            os.unlink(tmp)
        return json.loads(body)["token"]

    def replace(self, body, tag):
        if json.loads(body)["token"] == tag:  # a heartbeat: our own lease, rewritten
            now = self.read()
            if now is None or now[1] != tag:
                return None
            tmp = self._tmp(body)
            os.replace(tmp, self.path)
            return tag
        aside = f"{self.path}.{uuid.uuid4().hex}.old"
        try:
            os.rename(self.path, aside)  # of two drivers taking over, one renames it
        except FileNotFoundError:
            return self.create(body)
        with open(aside, "rb") as f:
            moved = json.loads(f.read()).get("token")
        if moved != tag:  # a newer lease than the one we judged: put it back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            os.unlink(aside)
            return None
        os.unlink(aside)
        return self.create(body)

    def delete(self, tag):
        now = self.read()
        if now is not None and now[1] == tag:
            os.unlink(self.path)


class _S3Backend(_Backend):
    def __init__(self, store: RunStore):
        super().__init__(store)
        self.key = store.key(LEASE)

    def _code(self, e) -> int:
        return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)

    def read(self):
        from botocore.exceptions import ClientError

        try:
            r = self.store.s3.get_object(Bucket=self.store.bucket, Key=self.key)
        except ClientError as e:
            if self._code(e) == 404:
                return None
            raise
        try:
            return json.loads(r["Body"].read()), r["ETag"]
        except ValueError:
            raise StoreError(f"{self.store.url(LEASE)} is not an xling lease: remove it if no "
                             "driver is running on this run root") from None

    def _put(self, body: bytes, **cond) -> str | None:
        from botocore.exceptions import ClientError

        try:
            return self.store.s3.put_object(Bucket=self.store.bucket, Key=self.key, Body=body,
                                            **cond)["ETag"]
        except ClientError as e:
            if self._code(e) not in (409, 412):  # 409: a concurrent conditional write
                raise
        # Refused; but a retry of a request whose first attempt succeeded is refused too.
        now = self.read()
        if now is not None and now[0].get("token") == json.loads(body)["token"] and \
                now[0].get("heartbeat") == json.loads(body)["heartbeat"]:
            return now[1]
        return None

    def conditional(self) -> bool:
        """Whether the store honours If-None-Match on PutObject (probed once per bucket)."""
        from botocore.exceptions import ClientError

        key = (self.store.s3.meta.endpoint_url, self.store.bucket)
        if key not in _CONDITIONAL:
            probe = self.store.key(f"_lease.probe-{uuid.uuid4().hex}")
            s3, bucket = self.store.s3, self.store.bucket
            s3.put_object(Bucket=bucket, Key=probe, Body=b"1")
            try:
                s3.put_object(Bucket=bucket, Key=probe, Body=b"2", IfNoneMatch="*")
                _CONDITIONAL[key] = False
            except ClientError as e:
                _CONDITIONAL[key] = self._code(e) in (409, 412)
            finally:
                s3.delete_object(Bucket=bucket, Key=probe)
            if not _CONDITIONAL[key]:
                logger.warning("the S3 store at %s ignores conditional writes: the run-root lease "
                            "is checked by reading it back after %.0fs (see docs/design.md)",
                            key[0], SETTLE_S)
        return _CONDITIONAL[key]

    def _settled(self, body: bytes) -> str | None:
        """No conditional writes: ours if it still is after SETTLE_S (last writer wins)."""
        self.store.s3.put_object(Bucket=self.store.bucket, Key=self.key, Body=body)
        time.sleep(SETTLE_S)
        now = self.read()
        return now[1] if now and now[0].get("token") == json.loads(body)["token"] else None

    def create(self, body):
        if not self.conditional():
            return None if self.read() else self._settled(body)
        return self._put(body, IfNoneMatch="*")

    def replace(self, body, tag):
        if not self.conditional():
            now = self.read()
            return self._settled(body) if now is None or now[1] == tag else None
        return self._put(body, IfMatch=tag)

    def delete(self, tag):
        from botocore.exceptions import ClientError

        try:
            if self.conditional():
                self.store.s3.delete_object(Bucket=self.store.bucket, Key=self.key, IfMatch=tag)
            else:
                now = self.read()
                if now is not None and now[1] == tag:
                    self.store.delete(LEASE)
        except ClientError as e:
            if self._code(e) not in (404, 409, 412):
                raise


class RunLease:
    """This driver's lease on a run root: beats in a thread until `release`."""

    def __init__(self, store: RunStore, run_id: str, ttl: float, command: str):
        self.store = store
        self.backend = _S3Backend(store) if store.is_s3 else _LocalBackend(store)
        self.ttl = ttl
        self.info = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
                     "proc_start": _proc_start(os.getpid()), "command": command,
                     "started": _now(), "heartbeat": _now(), "ttl_s": ttl,
                     "token": uuid.uuid4().hex}
        self.tag: str | None = None
        self.lost = False
        self._said = False  # say_lost printed its line
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps({**self.info, "started_at": _iso(self.info["started"]),
                           "heartbeat_at": _iso(self.info["heartbeat"])}, indent=2).encode()

    def _start(self) -> None:
        _HELD[self.store.url()] = self
        atexit.register(self.release)  # a driver that raised before its own release
        self._thread = threading.Thread(target=self._beat, daemon=True,
                                        name=f"xling-lease-{self.info['run_id']}")
        self._thread.start()

    def _beat(self) -> None:
        every = max(0.5, self.ttl / 6)
        while not self._stop.wait(every):
            try:
                self.heartbeat()
            except Exception as e:  # a flaky store: the next beat tries again
                logger.warning("run-root lease heartbeat failed (%s); retrying in %.0fs", e, every)
            if self.lost:
                self.say_lost()
                _thread.interrupt_main()
                return

    def say_lost(self) -> None:
        """Say, once, who holds the run root now and that this driver stops."""
        with self._lock:
            if self._said:
                return
            self._said = True
        holder = self.backend.read()
        print(f"xling: this driver lost the run root {self.store.url()} to "
              f"{describe(holder[0]) if holder else 'nobody (the lease was removed)'}: "
              "stopping (committed shards are kept)", file=sys.stderr, flush=True)

    def heartbeat(self) -> bool:
        """Renew the lease; False (and `lost`) when another driver holds it now."""
        with self._lock:
            if self._stop.is_set() or self.lost:
                return not self.lost
            self.info["heartbeat"] = _now()
            tag = self.backend.replace(self._body(), self.tag)
            if tag is None:
                self.lost = True
                return False
            self.tag = tag
            return True

    def release(self) -> None:
        """Stop beating and remove the lease if it is still ours."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            atexit.unregister(self.release)
            if _HELD.get(self.store.url()) is self:
                del _HELD[self.store.url()]
            if not self.lost and self.tag is not None:
                try:
                    self.backend.delete(self.tag)
                except Exception as e:  # it expires by itself
                    logger.warning("could not remove the run-root lease %s: %s",
                                   self.store.url(LEASE), e)

    def _abandon(self) -> None:
        """An earlier lease of this process on the same root (a run that raised before its
        release): stop its heartbeat; the caller takes the lease over."""
        self._stop.set()


def stop_if_lost(store: RunStore) -> None:
    """Before a driver records a failure in `store`: if another driver has taken the run root
    over since the last heartbeat, stop (KeyboardInterrupt: exit 130) instead. The failure is
    most likely the new driver's doing (at its start it clears the pieces in flight, this
    driver's among them), and a driver writes nothing to a root it no longer holds."""
    lease = _HELD.get(store.url())
    if lease is not None and not lease.heartbeat():
        lease.say_lost()
        raise KeyboardInterrupt


def acquire(store: RunStore, run_id: str, *, takeover: bool = False, log=print,
            command: str | None = None, ttl: float | None = None) -> RunLease:
    """Take the run root's lease for this driver, or raise LeaseHeld saying who has it."""
    lease = RunLease(store, run_id, ttl_s() if ttl is None else ttl,
                     command or shlex.join(["xling", *sys.argv[1:]]))
    for _ in range(5):  # each round loses only to a driver that just moved
        current = lease.backend.read()
        if current is None:
            lease.tag = lease.backend.create(lease._body())
            if lease.tag is not None:
                lease._start()
                return lease
            continue
        info, tag = current
        now = _now()
        age = now - float(info.get("heartbeat", 0))
        mine = info.get("host") == socket.gethostname() and info.get("pid") == os.getpid()
        if mine:
            why = None
            if (old := _HELD.get(store.url())) is not None:
                old._abandon()
        elif _process_gone(info):
            why = "its process is gone"
        elif age > float(info.get("ttl_s", DEFAULT_TTL_S)):
            why = f"its heartbeat stopped {age:.0f}s ago (ttl {info.get('ttl_s')}s)"
        elif takeover:
            why = ("--takeover; if that driver is still running, it stops at its next "
                   "heartbeat")
        else:
            wait = float(info.get("ttl_s", DEFAULT_TTL_S)) - age
            raise LeaseHeld(
                f"run root {store.url()} is in use by {describe(info, now)}. Wait for it to "
                f"finish, or stop it; if it died, its lease expires {wait:.0f}s from now, or "
                f"rerun with --takeover to take it at once")
        lease.info["heartbeat"] = _now()
        lease.tag = lease.backend.replace(lease._body(), tag)
        if lease.tag is not None:
            if why:
                log(f"[xling] took over the run root {store.url()} from {describe(info, now)}: "
                    f"{why}")
            lease._start()
            return lease
    raise LeaseHeld(f"run root {store.url()}: other drivers kept taking the lease; "
                    "check `xling status` and rerun")
