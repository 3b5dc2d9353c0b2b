"""Reading text line by line from any stream: pyarrow's input streams (local or S3) have no
`readline`, so corpora, topics, runs and study files all read through `iter_lines`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

CHUNK = 1 << 16


def iter_lines(stream: IO) -> Iterator:
    """Lines of a binary or text stream, without their newline.

    Uses only `read(n)`: pyarrow's input streams have no `readline` and no line iteration.
    """
    tail = None
    while data := stream.read(CHUNK):
        *lines, tail = (data if tail is None else tail + data).split(
            b"\n" if isinstance(data, bytes) else "\n")
        yield from lines
    if tail:
        yield tail
