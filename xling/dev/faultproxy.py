"""An HTTP proxy that makes an S3 server misbehave, for fault tests.

It sits in front of the test SeaweedFS (`AWS_ENDPOINT_URL` points at the proxy) and passes
requests through unchanged (the Host header too, so signatures still verify), except that,
at set rates, drawn per request from a seeded generator, it

    slowdown   answers 503 SlowDown, as S3 throttles (the request is not forwarded)
    error500   answers 500 InternalError (not forwarded)
    reset      resets the connection (TCP RST, no response): half of these before the
               request reaches the server, half after the server has done it, so a client
               that retries repeats a request that already happened
    delay      holds the response for `delay_s` seconds

(with `match`, only on requests whose "METHOD /path" the regex finds: a persistent failure
of one object, say).
Every client retry is counted: boto3 and the AWS C++ SDK (pyarrow) send `amz-sdk-request:
attempt=N; max=M` with each attempt. `stats()` gives requests, faults by kind, retries by
client, and the highest attempt seen.

    proxy = FaultProxy("http://127.0.0.1:8333", Faults(slowdown=0.05, reset=0.02)).start()
    os.environ["AWS_ENDPOINT_URL"] = proxy.url
    ...
    proxy.stats(); proxy.stop()

Shell: `python -m xling.dev.faultproxy --upstream URL --slowdown 0.05 --stats FILE` runs one
in the foreground and writes its stats to FILE every second (for a driver in another
process).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

# Hop-by-hop headers, and those the proxy rewrites because it re-frames the body.
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade", "expect", "content-length"}
_ATTEMPT = re.compile(r"attempt=(\d+)")


@dataclass
class Faults:
    slowdown: float = 0.0
    error500: float = 0.0
    reset: float = 0.0
    delay: float = 0.0
    delay_s: float = 0.5
    seed: int = 0
    match: str = ""  # only requests whose "METHOD /path" this regex finds get faults

    def check(self) -> "Faults":
        rates = [self.slowdown, self.error500, self.reset, self.delay]
        if any(not 0 <= r <= 1 for r in rates) or sum(rates[:3]) > 1:
            raise ValueError(f"fault rates must be in [0, 1], the failures summing to <= 1: {self}")
        return self


_ERRORS = {"slowdown": (503, "SlowDown", "Please reduce your request rate."),
           "error500": (500, "InternalError",
                        "We encountered an internal error. Please try again.")}


class FaultProxy:
    def __init__(self, upstream: str, faults: Faults | None = None, host: str = "127.0.0.1",
                 port: int = 0):
        up = urlparse(upstream)
        self.upstream = (up.hostname or "127.0.0.1", up.port or 80)
        self.faults = (faults or Faults()).check()
        self._rng = random.Random(self.faults.seed)
        self._lock = threading.Lock()
        self._counts: Counter = Counter()
        self._max_attempt = 0
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FaultProxy":
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="faultproxy")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def set_faults(self, faults: Faults) -> None:
        """New rates from the next request on (the generator keeps its state)."""
        with self._lock:
            self.faults = faults.check()

    def stats(self) -> dict:
        with self._lock:
            c = dict(self._counts)
            return {"requests": c.get("requests", 0),
                    "faults": {k: c.get(k, 0) for k in ("slowdown", "error500", "reset_before",
                                                        "reset_after", "delay")},
                    "retries": {k[8:]: v for k, v in sorted(c.items()) if k.startswith("retries:")},
                    "max_attempt": self._max_attempt, "rates": asdict(self.faults)}

    def _draw(self, headers, target: str) -> list[str]:
        """The faults of one request, and its attempt counted."""
        agent = headers.get("User-Agent", "")
        client = ("boto3" if "Boto3" in agent or "Botocore" in agent else
                  "aws-sdk-cpp" if "aws-sdk-cpp" in agent else "other")
        m = _ATTEMPT.search(headers.get("amz-sdk-request", ""))
        attempt = int(m.group(1)) if m else 1
        with self._lock:
            self._counts["requests"] += 1
            if attempt > 1:
                self._counts[f"retries:{client}"] += 1
                self._max_attempt = max(self._max_attempt, attempt)
            f, x = self.faults, self._rng.random()
            out = []
            if f.match and not re.search(f.match, target):
                return out
            for kind, rate in (("slowdown", f.slowdown), ("error500", f.error500),
                               ("reset", f.reset)):
                if x < rate:
                    out.append(kind if kind != "reset" else
                               ("reset_before" if self._rng.random() < 0.5 else "reset_after"))
                    break
                x -= rate
            if self._rng.random() < f.delay:
                out.append("delay")
            for kind in out:
                self._counts[kind] += 1
            return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultProxy

    def log_message(self, *args) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _reset(self) -> None:
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.connection.close()  # RST, not FIN
        except OSError:
            pass

    def _upstream(self) -> http.client.HTTPConnection:
        conn = getattr(self, "_conn", None)
        if conn is None:
            conn = self._conn = http.client.HTTPConnection(*self.owner.upstream, timeout=120)
        return conn

    def _forward(self, body: bytes):
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        for attempt in range(2):  # a kept-alive upstream connection may have been closed
            try:
                conn = self._upstream()
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                return resp, (resp.read() if self.command != "HEAD" else b"")
            except (http.client.HTTPException, OSError):
                self._conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _handle(self) -> None:
        body = self._body()
        faults = self.owner._draw(self.headers, f"{self.command} {self.path}")
        if "reset_before" in faults:
            return self._reset()
        if "slowdown" in faults or "error500" in faults:
            status, code, message = _ERRORS["slowdown" if "slowdown" in faults else "error500"]
            xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                   f"<Message>{message}</Message><RequestId>faultproxy</RequestId></Error>"
                   ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(xml)
            return
        resp, data = self._forward(body)
        if "reset_after" in faults:
            return self._reset()
        if "delay" in faults:
            time.sleep(self.owner.faults.delay_s)
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", resp.getheader("Content-Length", str(len(data)))
                         if self.command == "HEAD" else str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:  # the connection this handler reset
            pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m xling.dev.faultproxy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", required=True, help="the S3 server's URL")
    p.add_argument("--port", type=int, default=0)
    for name in ("slowdown", "error500", "reset", "delay"):
        p.add_argument(f"--{name}", type=float, default=0.0, help=f"rate of {name} faults")
    p.add_argument("--delay-s", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--match", default="", help="fault only requests whose 'METHOD /path' "
                                               "this regex finds")
    p.add_argument("--stats", default=None, help="write the stats (JSON) here every second")
    a = p.parse_args(argv)
    proxy = FaultProxy(a.upstream, Faults(a.slowdown, a.error500, a.reset, a.delay, a.delay_s,
                                          a.seed, a.match), port=a.port).start()
    print(proxy.url, flush=True)
    try:
        while True:
            time.sleep(1)
            if a.stats:
                with open(a.stats, "w") as f:
                    json.dump(proxy.stats(), f)
    except KeyboardInterrupt:
        proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
