"""Quiet by default (core/logs.py): log-level parsing, the progress printer off a terminal,
the console's two kinds of lines, the report digest, and the CLI's -v flag. No Ray."""

import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from xling.core.config import ConfigError
from xling.core.logs import (Console, Progress, level_name, local_log_dir, parse_level,
                             report_digest, resolve_level)

ROOT = Path(__file__).resolve().parents[2]


def test_log_levels():
    assert parse_level("debug") == logging.DEBUG and parse_level(" INFO ") == logging.INFO
    assert parse_level("warn") == parse_level("WARNING") == logging.WARNING
    assert parse_level("ERROR") == logging.ERROR and parse_level("15") == 15
    assert parse_level(None) == parse_level("") == logging.WARNING  # the default
    with pytest.raises(ConfigError, match="XLING_LOG_LEVEL='loud'"):
        parse_level("loud")
    assert resolve_level(0, {}) == logging.WARNING
    assert resolve_level(0, {"XLING_LOG_LEVEL": "error"}) == logging.ERROR
    assert resolve_level(1, {"XLING_LOG_LEVEL": "error"}) == logging.INFO  # -v wins
    assert resolve_level(2, {}) == logging.DEBUG
    assert level_name(logging.INFO) == "INFO"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_off_a_terminal_prints_plain_periodic_lines():
    out, clock = io.StringIO(), Clock()
    p = Progress(10_000, "translate", stream=out, tty=False, clock=clock)
    clock.t = 1.0
    p.update(500, tokens=100)  # 5%, 1 s: nothing yet
    clock.t = 12.0
    p.update(734, tokens=580)  # crosses 10% after more than 5 s: a line
    clock.t = 13.0
    p.update(1000)  # crosses 20%, but 1 s after the last line: nothing
    clock.t = 44.0
    p.update(10)  # 30 s since the last line: a line
    clock.t = 100.0
    p.update(10_000 - 2_244)
    p.close()
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert lines[0] == "[translate] 1,234/10,000 records (12%), 56.7 tok/s, eta 1m"
    assert lines[1].startswith("[translate] 2,244/10,000 records (22%), ")
    assert lines[2] == "[translate] 10,000/10,000 records (100%), 6.8 tok/s, 1m"
    assert len(lines) == 3 == p.lines


def test_progress_without_tokens_counts_records_and_can_be_off():
    out, clock = io.StringIO(), Clock()
    p = Progress(40, "ingest", stream=out, tty=False, clock=clock)
    clock.t = 8.0
    p.update(40)  # done: the final line comes from close()
    p.close()
    p.close()  # idempotent
    assert out.getvalue() == "[ingest] 40/40 records (100%), 5.0 records/s, 8s\n"
    off = io.StringIO()
    q = Progress(5, "ingest", stream=off, tty=False, enabled=False)
    q.update(5)
    q.close()
    assert off.getvalue() == "" and q.done == 5


def test_progress_on_a_terminal_is_a_tqdm_bar_with_tokens_per_second():
    out = io.StringIO()
    p = Progress(4, "generate", stream=out, tty=True)
    p.update(2, tokens=300)
    p.update(2, tokens=300)
    p.close()
    text = out.getvalue()
    assert "[generate]" in text and "4/4" in text and "tok/s" in text


def test_console_details_go_to_the_log_file_and_to_the_console_only_when_verbose(tmp_path):
    out = io.StringIO()
    quiet = Console(logging.WARNING, log_dir=str(tmp_path / "_logs"), run_id="r1", stream=out)
    quiet.say("[index] 2 cell(s): 2 to run")
    quiet.detail("[index] a.b.c: 4 input rows, 2 shards, 0 already committed, 2 to run")
    quiet.close()
    assert out.getvalue() == "[index] 2 cell(s): 2 to run\n"
    logged = (tmp_path / "_logs" / "xling-r1.log").read_text()
    assert "2 cell(s): 2 to run" in logged and "0 already committed, 2 to run" in logged
    out = io.StringIO()
    loud = Console(logging.INFO, stream=out)
    loud.detail("[index] a.b.c: committed 4 rows")
    assert loud.verbose and out.getvalue() == "[index] a.b.c: committed 4 rows\n"


def test_log_dirs():
    assert local_log_dir("/tmp/run", "demo") == "/tmp/run/_logs"
    assert local_log_dir("s3://b/p", "demo", cache="/c") == "/c/logs/demo"


REPORT = """# xling run report

run root: /tmp/r
written: now

3 of 3 cells done, 40 rows, 0 error rows.

```
stage  cell  state
```

## Where

- ingest / a: /tmp/r/ingest/a/part-*.parquet

## Results

### known-item-fi: queries fi, documents fi

| system | map |
|---|---|
| bm25 | 1.0000 |

A note under the table.

**Table 3: accuracy (%)**

| Model | No Retrieval |
|---|---|
| tiny-chat | 0.00 |
"""


def test_report_digest_prints_the_results_once_and_compactly():
    text = report_digest(REPORT, "/tmp/r/report/summary.md")
    assert text.splitlines() == [
        "[report] 3 of 3 cells done, 40 rows, 0 error rows.",
        "## Results",
        "### known-item-fi: queries fi, documents fi",
        "| system | map |", "| bm25 | 1.0000 |",
        "[report] -> /tmp/r/report/summary.md"]
    short = report_digest(REPORT, "x", max_lines=2).splitlines()
    assert short[-2] == "... 1 more line(s) of results in the report"
    assert report_digest("no results here", "x") == "[report] -> x"
    # Each study's first table, its own headings kept, oracle rows and long tails cut;
    # a study's `## ` heading does not end the results, the report's own sections do.
    studies = ("## Results\n\n### retrieval\n\n### ki: map\n\n| | FI |\n|---|---|\n"
               + "".join(f"| run{i} | 0.{i} |\n| run{i}+oracle | 1.0 |\n" for i in range(12))
               + "\n### study: mirage\n\n## MIRAGE-Bench: Table 2\n\n| lang | tau |\n"
               "|---|---|\n| en | 1.000 |\n\n| second | table |\n\n## Cells\n\n| x | y |\n")
    assert report_digest(studies, "x").splitlines() == [
        "## Results", "### retrieval", "### ki: map", "| | FI |",
        *[f"| run{i} | 0.{i} |" for i in range(8)], "| ... 4 more row(s) |",
        "### study: mirage", "## MIRAGE-Bench: Table 2", "| lang | tau |", "| en | 1.000 |",
        "[report] -> x"]


def test_cli_verbose_flag_and_bad_level(tmp_path):
    from xling.cli import build_parser

    args = build_parser().parse_args(["run", "-c", "x.yaml", "-vv"])
    assert args.verbose == 2
    assert build_parser().parse_args(["ingest", "-c", "x.yaml"]).verbose == 0
    # A bad XLING_LOG_LEVEL is a config error (exit 2) before anything runs.
    p = subprocess.run([sys.executable, "-m", "xling.cli", "ingest", "--config",
                        "configs/demo.yaml", f"run_root={tmp_path}/run", "--dry-run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "XLING_LOG_LEVEL": "loud"})
    assert p.returncode == 2 and "XLING_LOG_LEVEL='loud'" in p.stderr, p.stderr
    assert not (tmp_path / "run").exists()


def test_native_stderr_goes_to_the_log_and_python_keeps_the_terminal(tmp_path):
    import subprocess
    import sys

    log = tmp_path / "native.log"
    code = ("import os, sys; from xling.core.logs import native_stderr_to; "
            f"assert native_stderr_to({str(log)!r}); "
            "os.write(2, b'core_worker.cc: native noise\\n'); "
            "print('xling: error: for the user', file=sys.stderr); "
            f"assert not native_stderr_to({str(log)!r})")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "xling: error: for the user\n"
    assert log.read_text() == "core_worker.cc: native noise\n"
