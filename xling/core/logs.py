"""What the driver prints, and where everything else goes.

Quiet by default: a run prints one line when a stage starts, its progress bar, one line when
it ends, and the results at the end. Everything else goes to log files:

    {run_root}/_logs/xling-<run id>.log   the driver's log: every per-cell line (inputs,
                                         shards, commits), Python logging at INFO and up
    {run_root}/_logs/ray-workers/<run id>/ a local Ray's worker stdout/stderr for the run
                                         (Lucene/JVM, vLLM, transformers...), copied at exit

(for an `s3://` run root the files are written under `.xling-cache/logs/<run name>/` and
uploaded to `{run_root}/_logs/` when each stage ends). On a remote Ray cluster the workers'
output stays in Ray's session logs on each node (`ray logs`, the dashboard's Logs tab).

The level comes from `-v` (INFO; `-vv` DEBUG) or `XLING_LOG_LEVEL` (DEBUG, INFO, WARNING,
ERROR; default WARNING). At INFO and below the per-cell lines and the workers' own output
(Ray's log_to_driver) come back to the console. The driver puts the level in the workers'
environment (`XLING_LOG_LEVEL`), where the actors set the JVM's log4j, vLLM and transformers
levels from it (actors cannot import this module).

On a terminal the progress bar is tqdm's; elsewhere (`ray job logs`, CI, a pipe) it prints
plain lines at most every 30 s, with no carriage returns:

    [translate] 1,234/10,000 records (12%), 56.7 tok/s, eta 3m
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from typing import Callable, TextIO

from xling.core.config import ConfigError

ENV = "XLING_LOG_LEVEL"
LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
          "WARN": logging.WARNING, "ERROR": logging.ERROR}
DEFAULT = logging.WARNING


class LogLevelError(ConfigError):
    pass


def parse_level(value: str | int | None, default: int = DEFAULT) -> int:
    """A level name (any case) or number -> a logging level; None or "" -> `default`."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    if isinstance(value, int):
        return value
    text = value.strip().upper()
    if text in LEVELS:
        return LEVELS[text]
    if text.isdigit():
        return int(text)
    raise LogLevelError(f"{ENV}={value!r}: use DEBUG, INFO, WARNING or ERROR")


def level_name(level: int) -> str:
    return logging.getLevelName(level) if level in (10, 20, 30, 40, 50) else str(level)


def resolve_level(verbose: int = 0, environ: dict | None = None) -> int:
    """-v -> INFO, -vv -> DEBUG; otherwise XLING_LOG_LEVEL; otherwise WARNING."""
    if verbose >= 2:
        return logging.DEBUG
    if verbose == 1:
        return logging.INFO
    return parse_level((os.environ if environ is None else environ).get(ENV))


# ---------------------------------------------------------------------------------------
# progress


def _count(n: float) -> str:
    return f"{int(n):,}"


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" if s < 600 else f"{round(s / 60)}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Progress:
    """One stage's progress: records done of `total`, and output tokens when the stage
    reports them (translate, generate, judge...). Thread-safe (groups of cells run side by
    side and share it).

    tty=True: a tqdm bar (records/s, and tok/s as its postfix). tty=False: a plain line at
    most every `every_s` seconds, or on crossing a `step` fraction when at least
    `min_gap_s` passed since the last line, and a final line at `close()`.
    """

    def __init__(self, total: int, label: str, *, stream: TextIO | None = None,
                 tty: bool | None = None, enabled: bool = True, every_s: float = 30.0,
                 step: float = 0.1, min_gap_s: float = 5.0, final_line: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.label, self.enabled = int(total), label, enabled
        self.final_line = final_line  # off when the caller prints its own summary line
        self.stream = stream if stream is not None else sys.stderr
        self.tty = (hasattr(self.stream, "isatty") and self.stream.isatty()) if tty is None else tty
        self.every_s, self.step, self.min_gap_s, self.clock = every_s, step, min_gap_s, clock
        self.done = self.tokens = 0
        self.started = self.last_line = clock()
        self.closed_at: float | None = None
        self.last_step = 0
        self.lines = 0  # plain lines printed (tests)
        self._lock = threading.Lock()
        self._bar = None
        if enabled and self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=f"[{label}]", unit="rec", file=self.stream,
                             dynamic_ncols=True, leave=True)

    def update(self, records: int = 0, tokens: int = 0) -> None:
        with self._lock:
            self.done += records
            self.tokens += tokens
            if not self.enabled:
                return
            if self._bar is not None:
                if tokens or self.tokens:
                    self._bar.set_postfix_str(f"{self.rate(tokens=True):.1f} tok/s", refresh=False)
                self._bar.update(records)
                return
            now = self.clock()
            step = int(self.fraction() / self.step) if self.step else 0
            if (now - self.last_line >= self.every_s
                    or (step > self.last_step and now - self.last_line >= self.min_gap_s)):
                if self.done < self.total:  # the final line comes from close()
                    self._line(now)
                    self.last_step = step

    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 1.0

    def rate(self, tokens: bool = False) -> float:
        elapsed = max((self.closed_at or self.clock()) - self.started, 1e-9)
        return (self.tokens if tokens else self.done) / elapsed

    def line(self, final: bool = False) -> str:
        """`[translate] 1,234/10,000 records (12%), 56.7 tok/s, eta 3m`"""
        elapsed = self.clock() - self.started
        speed = (f"{self.rate(tokens=True):,.1f} tok/s" if self.tokens
                 else f"{self.rate():,.1f} records/s")
        text = (f"[{self.label}] {_count(self.done)}/{_count(self.total)} records "
                f"({self.fraction():.0%}), {speed}")
        if final:
            return f"{text}, {_duration(elapsed)}"
        if self.done and self.total > self.done:
            return f"{text}, eta {_duration(elapsed * (self.total - self.done) / self.done)}"
        return text

    def _line(self, now: float) -> None:
        print(self.line(), file=self.stream, flush=True)
        self.last_line = now
        self.lines += 1

    def close(self) -> None:
        with self._lock:
            self.closed_at = self.closed_at or self.clock()
            if not self.enabled:
                return
            if self._bar is not None:
                if self.tokens:
                    self._bar.set_postfix_str(f"{self.rate(tokens=True):.1f} tok/s", refresh=False)
                self._bar.close()
                self._bar = None
                return
            if self.total and self.final_line:
                print(self.line(final=True), file=self.stream, flush=True)
                self.lines += 1
            self.enabled = False

    def summary(self) -> str:
        """`1,770.9 tok/s` (or records/s) over the whole run, for a closing line."""
        return (f"{self.rate(tokens=True):,.1f} tok/s" if self.tokens
                else f"{self.rate():,.1f} records/s")


# ---------------------------------------------------------------------------------------
# the console and the log files


class Console:
    """The driver's two kinds of lines: `say` (stage lines, failures, results: always on
    the console) and `detail` (per-cell lines: the log file, and the console at INFO)."""

    def __init__(self, level: int = DEFAULT, *, log_dir: str | None = None,
                 run_id: str | None = None, stream: TextIO | None = None,
                 progress: bool = True):
        self.level, self.progress = level, progress
        self.stream = stream
        self.run_id = run_id or time.strftime("%Y%m%dT%H%M%S")
        self.log_dir = log_dir
        self.path = os.path.join(log_dir, f"xling-{self.run_id}.log") if log_dir else None
        self._file = None
        self._lock = threading.Lock()

    @property
    def verbose(self) -> bool:
        return self.level <= logging.INFO

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stdout

    def _write_file(self, line: str) -> None:
        if not self.path:
            return
        with self._lock:
            if self._file is None:
                os.makedirs(self.log_dir, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8", buffering=1)
            self._file.write(f"{time.strftime('%H:%M:%S')} {line}\n")

    def say(self, line: str) -> None:
        print(line, file=self._out(), flush=True)
        self._write_file(line)

    def detail(self, line: str) -> None:
        if self.verbose:
            print(line, file=self._out(), flush=True)
        self._write_file(line)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def configure_python_logging(level: int, log_file: str | None) -> None:
    """Driver-side Python logging: `level` and up on stderr, INFO and up (or `level` when
    lower) in the log file; library warnings (`warnings.warn`) go through logging too."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_xling", False):
            root.removeHandler(h)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(level)
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    console._xling = True  # type: ignore[attr-defined]
    root.addHandler(console)
    file_level = min(level, logging.INFO)
    if log_file:
        os.makedirs(os.path.dirname(log_file), exist_ok=True)
        fh = logging.FileHandler(log_file, encoding="utf-8")
        fh.setLevel(file_level)
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        fh._xling = True  # type: ignore[attr-defined]
        root.addHandler(fh)
    root.setLevel(file_level if log_file else level)
    logging.captureWarnings(True)
    quiet_libraries(level)


# Ray's driver-side warnings that are never actionable here (we turn Ray Data's bars off).
RAY_NOISE = ("Token authentication is enabled", "Progress bars disabled")


class _DropRayNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(n in msg for n in RAY_NOISE)


def quiet_ray_loggers() -> None:
    """Drop RAY_NOISE from the handlers of Ray's loggers (call after `import ray` and again
    after `ray.init`, which may set up its handlers anew)."""
    for name in ("ray", "ray.data", ""):
        for h in logging.getLogger(name).handlers:
            if not any(isinstance(f, _DropRayNoise) for f in h.filters):
                h.addFilter(_DropRayNoise())


def quiet_libraries(level: int) -> None:
    """transformers' verbosity in this process and (inherited) a local Ray's workers."""
    name = level_name(level) if level in (10, 20, 30, 40) else "WARNING"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", name.lower())


def native_stderr_to(path: str) -> bool:
    """Quiet runs: what native code writes to file descriptor 2 (Ray's C++ core worker in
    the driver, a local raylet and its daemons, the JVM) goes to `path`; Python's
    `sys.stderr` (progress, warnings, errors) keeps the terminal. Only in a process whose
    stderr is its own (not under pytest's capture); once. Returns whether it redirected."""
    if sys.stderr is not sys.__stderr__ or getattr(native_stderr_to, "path", None):
        return False
    try:
        sys.stderr.flush()
        keep = os.dup(2)
        terminal = open(keep, "w", buffering=1, encoding=sys.stderr.encoding or "utf-8",
                        errors="backslashreplace", closefd=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except (OSError, ValueError, AttributeError):  # no fd 2 (some embedders): leave it
        return False
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = sys.__stderr__ = terminal
    native_stderr_to.path = path
    return True


def local_log_dir(run_root: str, name: str, cache: str | None = None) -> str:
    """Where the log files are written on this machine: `{run_root}/_logs` for a local run
    root, `.xling-cache/logs/<run name>` (uploaded to `{run_root}/_logs`) for S3."""
    if run_root.startswith("s3://"):
        base = cache or os.environ.get("XLING_CACHE") or ".xling-cache"
        return os.path.join(base, "logs", name or "run")
    return os.path.join(run_root, "_logs")


def copy_worker_logs(dest: str, job_id: str | None = None) -> int:
    """A local Ray's worker stdout/stderr files of this job (non-empty ones) -> `dest`.
    Returns how many were copied (0 when Ray is remote or the logs cannot be found)."""
    import glob
    import shutil

    try:
        import ray

        node = ray._private.worker.global_worker.node
        logs = node.get_logs_dir_path()
    except Exception:  # a private Ray API; a missing copy is never a failure
        return 0
    n = 0
    for path in sorted(glob.glob(os.path.join(logs, "worker-*"))):
        if not path.endswith((".out", ".err")) or os.path.getsize(path) == 0:
            continue
        if job_id and f"-{job_id}-" not in os.path.basename(path):
            continue
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(path, os.path.join(dest, os.path.basename(path)))
        n += 1
    return n


_CELLS_DONE = re.compile(r"^\d+ of \d+ cells done\b")
_SEPARATOR = re.compile(r"^\|?\s*:?-{3,}")
# The report's own sections (jobs/report.py): the Results section ends at the next one, and
# inside it each study starts at `### retrieval` or `### study: <name>`.
_REPORT_SECTIONS = ("## Cells", "## Where", "## Superseded cells", "## Provenance")
_STUDY = re.compile(r"^### (retrieval|study: .+)$")
RESULT_LINES = 24  # the most lines of results a quiet run prints (the report has the rest)
TABLE_ROWS = 8  # rows of each study's first table


def report_digest(text: str, path: str, max_lines: int = RESULT_LINES) -> str:
    """What a quiet run prints of the report: its one-line summary, then for each study of
    its `## Results` the first table (its title and at most TABLE_ROWS rows, no oracle
    rows), at most `max_lines` lines in all, and where the whole report is."""
    lines = text.splitlines()
    out = [f"[report] {l}" for l in lines if _CELLS_DONE.match(l)][:1]
    sections: list[list[str]] = []
    stripped = [l.strip() for l in lines]
    if "## Results" in stripped:
        start = stripped.index("## Results") + 1
        for m in lines[start:]:
            if m.startswith(_REPORT_SECTIONS):
                break
            if _STUDY.match(m) or not sections:
                sections.append([])
            sections[-1].append(m.rstrip())
    body: list[str] = []
    for sec in sections:
        head = sec[0] if _STUDY.match(sec[0]) else None
        title, rows, started = None, [], False
        for m in sec[1:] if head else sec:
            if m.startswith("|"):
                started = True
                if not _SEPARATOR.match(m) and not m.split("|")[1].strip().endswith("+oracle"):
                    rows.append(m)
            elif started:
                break
            elif m.startswith(("#", "**")):
                title = m
        if not rows:
            continue
        shown = rows[:TABLE_ROWS + 1]  # the header and TABLE_ROWS rows
        body += [x for x in (head, title) if x] + shown
        if len(rows) > len(shown):
            body.append(f"| ... {len(rows) - len(shown)} more row(s) |")
    if len(body) > max_lines:
        more = len(body) - max_lines
        body = body[:max_lines] + [f"... {more} more line(s) of results in the report"]
    out += ["## Results", *body] if body else []
    out.append(f"[report] -> {path}")
    return "\n".join(out)
