"""Loaders for MIRAGE-Bench's three hub layouts (s1.3), from a local path or ``s3://``
(pyarrow.fs): the queries (``nthakur/mirage-bench``), the published answers and features
(``-output``) and the published pairwise verdicts (``-pairwise-judgments``)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from xling.studies.mirage.constants import FEATURE_ALIASES, FEATURES
from xling.studies.mirage.options import Knobs, Options, is_published
from xling.studies.mirage.parse import normalize_verdict, parse_pairwise
from xling.studies.mirage.prompts import parse_prompt


def _filesystem(path: str, filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str]:
    if filesystem is not None:
        return filesystem, path
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), str(Path(path).resolve())


def _split_file(split: str, name: str) -> bool:
    return re.fullmatch(rf"{re.escape(split)}(-.*)?\.parquet", name) is not None


def read_split(path: str, lang: str | None = None, split: str = "dev",
               filesystem: pafs.FileSystem | None = None,
               columns: list[str] | None = None) -> pa.Table:
    """A hub snapshot's ``{lang}/{split}-*.parquet`` (or one Parquet file), local or s3
    (``columns``: only those). ``dev.small-*`` files beside ``dev-*`` are not read."""
    fs, root = _filesystem(path, filesystem)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        files = [root]
    else:
        base = f"{root.rstrip('/')}/{lang}" if lang else root
        nested = not lang or fs.get_file_info(base).type == pafs.FileType.Directory
        # without a {lang}/ folder only the files directly in root are this language's
        found = fs.get_file_info(pafs.FileSelector(base if nested else root, recursive=nested,
                                                   allow_not_found=True))
        files = sorted(f.path for f in found if f.type == pafs.FileType.File
                       and _split_file(split, f.base_name))
    if not files:
        raise FileNotFoundError(f"{path}: no {split}-*.parquet for {lang or 'any language'}; "
                                "point at a snapshot of the hub dataset")
    return pa.concat_tables([pq.read_table(f, filesystem=fs, columns=columns) for f in files],
                            promote_options="default")


def load_queries(path: str, lang: str, split: str = "dev",
                 filesystem: pafs.FileSystem | None = None) -> list[dict]:
    """``nthakur/mirage-bench`` rows as items: ``query_id, lang, query, passages
    [(docid, text)], contexts, qrels {docid: 1/0}, prompt, error``."""
    items = []
    for row in read_split(path, lang, split, filesystem).to_pylist():
        parsed = parse_prompt(row.get("prompt") or "")
        qrels = {docid: 0 for docid in row.get("negative_ids") or []}
        qrels.update({docid: 1 for docid in row.get("positive_ids") or []})
        items.append({"query_id": str(row["query_id"]), "lang": lang, "query": parsed["query"],
                      "passages": parsed["passages"], "contexts": parsed["contexts"],
                      "qrels": qrels, "prompt": row.get("prompt"), "error": parsed["error"]})
    return items


def load_outputs(path: str, lang: str, split: str = "dev",
                 filesystem: pafs.FileSystem | None = None
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``nthakur/mirage-bench-output``: generations ``query_id, model, output`` (in the
    stored ``outputs`` order) and long feature rows ``query_id, model, feature, value``
    (research column names mapped to the released ones; null kept as NaN)."""
    table = read_split(path, lang, split, filesystem)
    gens, feats = [], []
    feature_cols = [c for c in table.column_names if (c in FEATURES or c in FEATURE_ALIASES
                    or c == "support_contradiction") and pa.types.is_struct(table.schema.field(
                        c).type)]
    for row in table.select(["query_id", "outputs", *feature_cols]).to_pylist():
        query_id = str(row["query_id"])
        gens += [{"query_id": query_id, "model": out["model"], "output": out["output"]}
                 for out in row["outputs"] or []]
        for column in feature_cols:
            name = FEATURE_ALIASES.get(column, column)
            feats += [{"query_id": query_id, "model": model, "feature": name,
                       "value": float("nan") if value is None else float(value)}
                      for model, value in (row[column] or {}).items()]
    return (pd.DataFrame(gens, columns=["query_id", "model", "output"]),
            pd.DataFrame(feats, columns=["query_id", "model", "feature", "value"]))


@functools.lru_cache(maxsize=8)
def published_roster(judgments: str, langs: tuple[str, ...], split: str = "dev"
                     ) -> frozenset[str]:
    """Every model the published pairwise judgments compare, over ``langs`` (the two model
    columns only, read once per snapshot)."""
    models: set[str] = set()
    for lang in langs:
        try:
            judged = read_split(judgments, lang, split, columns=["model_A", "model_B"])
        except FileNotFoundError:
            continue  # a language without judgments has no arena (counted at evaluate)
        models |= set(judged["model_A"].to_pylist()) | set(judged["model_B"].to_pylist())
    return frozenset(models)


def load_judgments(path: str, lang: str, split: str = "dev",
                   filesystem: pafs.FileSystem | None = None, knobs: Knobs = Knobs()
                   ) -> pd.DataFrame:
    """``nthakur/mirage-bench-pairwise-judgments``: ``query_id, model_A, model_B, verdict``
    with verdict normalised to A / B / tie / None; a verdict that is not one of these is
    re-parsed from the raw judge ``output`` when that column exists."""
    df = read_split(path, lang, split, filesystem).to_pandas()
    df["query_id"] = df["query_id"].astype(str)
    raw = df["output"] if "output" in df else pd.Series([None] * len(df), index=df.index)
    df["verdict"] = [normalize_verdict(verdict) or (parse_pairwise(output, knobs)
                                                    if isinstance(output, str) else None)
                     for verdict, output in zip(df["verdict"], raw)]
    return df


# --------------------------------------------------------------------------------------
# What the study reads for a config's options
# --------------------------------------------------------------------------------------

def input_files(opts: Options) -> list[str]:
    """The Parquet files the study reads (the cells' inputs, fingerprinted by the runner)."""
    roots = [opts.data] + ([opts.outputs, opts.judgments] if is_published(opts) else [])
    files = []
    for root in roots:
        fs, base = _filesystem(root, None)
        scheme = root.split("://", 1)[0] + "://" if "://" in root else ""
        for lang in opts.langs:
            found = fs.get_file_info(pafs.FileSelector(f"{base.rstrip('/')}/{lang}",
                                                       recursive=True, allow_not_found=True))
            names = sorted(f.path for f in found if f.type == pafs.FileType.File
                           and _split_file(opts.split, f.base_name))
            if not names:
                raise FileNotFoundError(f"{root}: no {lang}/{opts.split}-*.parquet; point "
                                        "study.options at a snapshot of the hub dataset")
            files += [scheme + name if scheme else name for name in names]
    return files


def items_of(opts: Options, lang: str) -> list[dict]:
    """The language's queries (the first ``limit``, in file order)."""
    items = load_queries(opts.data, lang, opts.split)
    return items[:opts.limit] if opts.limit else items


def failed(gen: Mapping) -> bool:
    """A generation the engine could not make (the mirage_rag parser itself never fails)."""
    return bool(gen.get("error")) and not gen.get("output")


def outputs_by_query(gens: Iterable[Mapping]) -> dict[str, dict[str, str]]:
    """``{query_id: {model: output}}`` of the generations that made an answer."""
    out: dict[str, dict[str, str]] = {}
    for gen in gens:
        if gen.get("output") and not failed(gen):
            out.setdefault(str(gen["item_id"]), {})[gen["model"]] = gen["output"]
    return out
