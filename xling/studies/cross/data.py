"""Reading the mLongRR CSVs (local or any URI pyarrow opens) into context rows, one per
(needles, language, length, depth, run), with the needles checked against the text."""

from __future__ import annotations

import csv
import io
import os
import re
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from xling.tasks.languages import get_language

if TYPE_CHECKING:
    from .options import Options

# A label as a whole number in a text (no digit right before or after it).
NUMBER_IN_TEXT = "(?<![0-9]){}(?![0-9])"


def lang_of_file(path: str) -> str | None:
    """The language of an mLongRR file name (``Swahili_needles.csv`` -> sw), or None."""
    stem = path.rstrip("/").rsplit("/", 1)[-1].split("_", 1)[0]
    try:
        return get_language(stem).code
    except Exception:  # noqa: BLE001 - any lookup failure means "not derivable"
        return None


def raise_csv_field_limit() -> int:
    """The shared files' texts (up to 298,020 characters; V2 rows ~3.3 MB) exceed Python's
    default ``csv.field_size_limit`` of 131,072 (s1.8). Raises it process-wide; returns it."""
    limit = sys.maxsize
    while True:
        try:
            csv.field_size_limit(limit)
            return limit
        except OverflowError:
            limit //= 2


def read_text(path: str, filesystem=None) -> str:
    """A whole UTF-8 file (BOM tolerated) from a local path or a URI pyarrow opens."""
    if filesystem is not None or "://" in path:
        import pyarrow.fs as pafs

        fs, inner = (filesystem, path) if filesystem is not None else \
            pafs.FileSystem.from_uri(path)
        with fs.open_input_stream(inner) as f:
            data = f.read()
    else:
        with open(path, "rb") as f:
            data = f.read()
    return data.decode("utf-8-sig")


def needles_in_columns(columns: Iterable[str]) -> int:
    """The needle count from the header: ``label`` -> 1, ``label1..labeln`` -> n (s1.8)."""
    cols = [c.strip() for c in columns]
    numbered = sorted(int(m.group(1)) for c in cols if (m := re.fullmatch(r"label(\d+)", c)))
    if "label" in cols and numbered:
        raise ValueError(f"both `label` and `label1..` columns: {cols}")
    if "label" in cols:
        return 1
    if numbered and numbered == list(range(1, len(numbered) + 1)):
        return len(numbered)
    raise ValueError(f"no `label` or `label1..labeln` columns: {cols}")


def length_value(length: str) -> int | None:
    """A length label as a number: ``"2k"`` -> 2000, ``"0.5k"`` -> 500; None if not one."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kK]?)\s*", str(length))
    if not m:
        return None
    return int(round(float(m.group(1)) * (1000 if m.group(2) else 1)))


def _position(value: str) -> int | str:
    v = str(value).strip()
    return int(v) if re.fullmatch(r"-?\d+", v) else v


def _floats(value) -> list[float] | None:
    if value is None or str(value).strip() == "":
        return None
    try:
        return [float(x) for x in str(value).split()]
    except ValueError:
        return None


def context_id(needles: int, lang: str, length: str, position, run: int,
               tag: str | None = None) -> str:
    """``{n}n.{lang}.{length}.{position}.r{run}``, with ``.{tag}`` after the language when
    the data entry has a tag (two files of one language and needle count)."""
    where = f"{lang}.{tag}" if tag else lang
    return f"{needles}n.{where}.{length}.{position}.r{run}"


def _check_labels(text: str, labels: list[str]) -> list[str]:
    """What is wrong with a row's labels: each must be a number found exactly once."""
    errors = []
    for label in labels:
        if not re.fullmatch(r"[0-9]+", label):
            errors.append(f"label {label!r} is not a number")
        else:
            count = len(re.findall(NUMBER_IN_TEXT.format(label), text))
            if count != 1:
                errors.append(f"label {label} occurs {count} times in the text")
    return errors


def parse_cases(text: str, *, lang: str, source: str = "<text>",
                length_unit: str | None = None, needles: int | None = None,
                tag: str | None = None) -> list[dict]:
    """Context rows of one mLongRR CSV's text (see :func:`load_file`); never raises for a
    bad row (it becomes a row with ``error``), raises ValueError for a bad header."""
    raise_csv_field_limit()
    reader = csv.DictReader(io.StringIO(text, newline=""))
    n_needles = needles_in_columns(reader.fieldnames or [])
    if needles is not None and needles != n_needles:
        raise ValueError(f"{source}: the data entry says {needles} needle(s) but the columns "
                         f"hold {n_needles}")
    for col in ("context_length", "position", "text"):
        if col not in (reader.fieldnames or []):
            raise ValueError(f"{source}: no `{col}` column in {reader.fieldnames}")
    label_cols = ["label"] if n_needles == 1 else [f"label{i}" for i in range(1, n_needles + 1)]
    city_cols = ["city"] if n_needles == 1 else [f"city{i}" for i in range(1, n_needles + 1)]
    out, seen = [], set()
    for row_no, row in enumerate(reader, 2):
        length = str(row.get("context_length") or "").strip()
        position = _position(row.get("position") or "")
        run = int(row["run"]) if str(row.get("run") or "").strip().isdigit() else 0
        cid = context_id(n_needles, lang, length, position, run, tag)
        body = row.get("text") or ""
        labels = [str(row.get(c) or "").strip() for c in label_cols]
        cities = [str(row.get(c) or "").strip() for c in city_cols]
        ctx = {"context_id": cid, "needles": n_needles, "lang": lang, "length": length,
               "length_value": length_value(length),
               "unit": length_unit or (row.get("count_unit") or "").strip() or "unknown",
               "position": position, "run": run, "text": body, "labels": labels,
               "cities": cities, "gold": None, "target": None, "depth_chars": None,
               "depth_measured": _floats(row.get("depth_measured")),
               "source": source, "tag": tag, "row": row_no, "error": None}
        errors = []
        if cid in seen:
            errors.append(f"duplicate case {cid}")
        seen.add(cid)
        if not body.strip():
            errors.append("empty text")
        errors += _check_labels(body, labels)
        if not errors:
            gold_i = max(range(n_needles), key=lambda i: (int(labels[i]), -i))
            ctx["gold"], ctx["target"] = labels[gold_i], gold_i
            ctx["depth_chars"] = [
                re.search(NUMBER_IN_TEXT.format(label), body).start() / max(1, len(body))
                for label in labels]
        else:
            ctx["error"] = f"{source} row {row_no}: " + "; ".join(errors)
        out.append(ctx)
    return out


_FILE_CACHE: dict[tuple, list[dict]] = {}


def load_file(path: str, *, lang: str | None = None, length_unit: str | None = None,
              needles: int | None = None, tag: str | None = None,
              filesystem=None) -> list[dict]:
    """The context rows of one mLongRR CSV: ``context_id`` (``{n}n.{lang}.{length}.
    {position}.r{run}``), ``needles``, ``lang``, ``length`` ("2k"), ``length_value`` (2000),
    ``unit``, ``position`` (int, or a string such as "random"), ``run`` (0 without a ``run``
    column), ``text``, ``labels``, ``cities``, ``gold`` (the largest label), ``target`` (its
    index in ``labels``), ``depth_chars`` (label start / text length, measured),
    ``depth_measured`` (the builder's count-based depth, when the file has it), ``source``,
    ``tag`` (the data entry's, in the context id when given), ``row`` and ``error``.
    Cached per (path, size, mtime); callers must not mutate rows."""
    lang = lang or lang_of_file(path)
    if lang is None:
        raise ValueError(f"{path}: no language given and none in the file name")
    key: tuple = (path, lang, length_unit, needles, tag)
    if filesystem is None and "://" not in path:
        st = os.stat(path)
        key += (st.st_size, st.st_mtime_ns)
        if key in _FILE_CACHE:
            return _FILE_CACHE[key]
    rows = parse_cases(read_text(path, filesystem), lang=lang, source=path,
                       length_unit=length_unit, needles=needles, tag=tag)
    if len(key) > 5:
        if len(_FILE_CACHE) > 16:
            _FILE_CACHE.clear()
        _FILE_CACHE[key] = rows
    return rows


def header_needles(path: str) -> int | None:
    """The needle count of a local CSV from its header line alone; None for a URI or a
    header that says nothing (the full load reports that)."""
    if "://" in path:
        return None
    raise_csv_field_limit()
    with open(path, encoding="utf-8-sig", newline="") as f:
        header = next(csv.reader(f), [])
    try:
        return needles_in_columns(header)
    except ValueError:
        return None


def same_ids_error(lang: str, needles: int, paths: Iterable[str]) -> str:
    """The message for two data files whose context ids would collide."""
    listed = " and ".join(paths)
    return (f"{listed} are both {needles}-needle {lang!r} files without distinct tags: their "
            f"context ids ({needles}n.{lang}.<length>.<depth>.r<run>) would collide and one "
            "file's rows would take the other's rankings; give each entry its own `tag` "
            "(e.g. `{path: ..., tag: v1}`) or drop one")


def load_contexts(opts: Options, *, filesystem=None) -> list[dict]:
    """Every context the options select. Two files of one language and needle count need
    distinct tags (ValueError otherwise)."""
    out, owner = [], {}
    for entry in opts.data:
        if entry.lang not in opts.context_langs:
            continue
        rows = load_file(entry.path, lang=entry.lang, length_unit=entry.length_unit,
                         needles=entry.needles, tag=entry.tag, filesystem=filesystem)
        if rows:
            key = (rows[0]["needles"], entry.lang, entry.tag)
            if key in owner and owner[key] != entry.path:
                raise ValueError(same_ids_error(entry.lang, key[0], [owner[key], entry.path]))
            owner[key] = entry.path
        kept = [r for r in rows if r["needles"] in opts.needles
                and (opts.lengths is None or r["length"] in opts.lengths)
                and (opts.positions is None or str(r["position"]) in opts.positions)
                and (opts.runs is None or str(r["run"]) in opts.runs)]
        out += kept[:opts.limit] if opts.limit else kept
    return out
