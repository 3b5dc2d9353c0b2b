"""BordIRLines' data: the BorderLines table (territories, countries, 49-language queries),
the BordIRLines hub layout (queries.tsv, hits, passages), the hits a prompt shows, and the
files the prompts depend on. Files are read once per content (cached by path, mtime, size).
"""

from __future__ import annotations

import csv
import functools
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from xling.studies.bordirlines.options import Options

# The retrieval settings of the hits (bordirlines.txt; the hub's data/<lang>/<retriever>/<mode>/)
Mode = Literal["no_ir", "qlang", "rel_langs", "qlang_en", "en", "swap"]
MODES: tuple[str, ...] = get_args(Mode)

PACKAGED = Path(__file__).resolve().parent / "data"
UNKNOWN = "Unknown"  # the table's Controller for territories without a controller
LETTERS = "ABCDEFGH"  # the original's option letters (LETTERS_MC = "A)".."H)")

# Directory of each mode's hits in the hub layout; swap re-uses the qlang hits.
HITS_MODE = {"qlang": "qlang", "rel_langs": "rel_langs", "qlang_en": "qlang_en", "en": "en",
             "swap": "qlang"}


# ======================================================================================
# BorderLines: territories, countries, 49-language queries
# ======================================================================================


@dataclass(frozen=True)
class Territory:
    """One row of ``disputed_territories.csv``; ``claimant_langs[i]`` is the query language
    of ``claimants[i]`` ("" for a country missing from ``countries_info.json``)."""

    name: str
    claimants: tuple[str, ...]
    controller: str
    region: str
    query_en: str
    claimant_langs: tuple[str, ...]
    controller_lang: str  # "" when unknown (Controller "Unknown" or not in countries_info)

    @property
    def known(self) -> bool:
        return self.controller != UNKNOWN

    def langs(self) -> list[str]:
        """The distinct claimant languages in claimant order."""
        return list(dict.fromkeys(c for c in self.claimant_langs if c))


@dataclass(frozen=True)
class BorderLines:
    root: Path
    territories: dict[str, Territory]  # CSV order
    countries: dict[str, str]  # country -> Lang_Code
    # lang -> territory -> (query text, options in claimant order)
    queries: dict[str, dict[str, tuple[str, tuple[str, ...]]]]

    def territory(self, name: str) -> Territory | None:
        found = self.territories.get(name)
        if found is None and "_" in name:
            found = self.territories.get(name.replace("_", " "))
        return found

    def options(self, lang: str, territory: str) -> tuple[str, ...] | None:
        query = self.queries.get(lang, {}).get(territory)
        return query[1] if query else None


# countries_info.json (borderlines @ 5de2146) lacks Suriname, a claimant of 4 territories
# (French Guiana, Marouini River, Tigri Area, Courantyne River); the 4 lines of
# queries/prompts.nl are exactly those territories' queries, so its language is Dutch.
_MISSING_COUNTRIES = {"Suriname": "nl"}


def _read_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f if line.strip()]


@functools.lru_cache(maxsize=8)
def _load_borderlines(root: str) -> BorderLines:
    base = Path(root)
    with open(base / "countries_info.json", encoding="utf-8") as f:
        info = json.load(f)
    countries = {**_MISSING_COUNTRIES, **{c: v["Lang_Code"] for c, v in info.items()}}
    territories: dict[str, Territory] = {}
    with open(base / "disputed_territories.csv", encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            claimants = tuple(c.strip() for c in row["Claimants"].split(";") if c.strip())
            controller = row["Controller"].strip()
            territories[row["Territory"]] = Territory(
                name=row["Territory"], claimants=claimants, controller=controller,
                region=row.get("Region", ""), query_en=row.get("Query", ""),
                claimant_langs=tuple(countries.get(c, "") for c in claimants),
                controller_lang=countries.get(controller, "") if controller != UNKNOWN else "")
    order = list(territories.values())
    queries: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {}
    query_dir = base / "queries"
    for path in sorted(query_dir.glob("prompts.*")):
        lang = path.suffix[1:]
        if lang == "txt":
            continue
        prompts = _read_lines(path)
        choices = [tuple(json.loads(x)) for x in _read_lines(query_dir / f"choices.{lang}")]
        owners = [t for t in order if lang in t.claimant_langs]
        if not (len(prompts) == len(choices) == len(owners)):
            raise ValueError(
                f"{path}: {len(prompts)} queries and {len(choices)} option lists, but "
                f"{len(owners)} territories have a claimant whose language is {lang!r}; the "
                f"query files must have one line per such territory, in table order")
        queries[lang] = {t.name: (q, c) for t, q, c in zip(owners, prompts, choices)}
    # English is the control language: every territory, from prompts_q_mc.txt/choices.txt.
    en_queries = _read_lines(query_dir / "prompts_q_mc.txt")
    en_choices = _read_lines(query_dir / "choices.txt")
    if not (len(en_queries) == len(en_choices) == len(order)):
        raise ValueError(f"{query_dir}: prompts_q_mc.txt/choices.txt must have one line per "
                         f"territory ({len(order)}), not {len(en_queries)}/{len(en_choices)}")
    queries["en"] = {t.name: (q, tuple(json.loads(c)))
                     for t, q, c in zip(order, en_queries, en_choices)}
    return BorderLines(base, territories, countries, queries)


def territory_root(path: str | os.PathLike | None) -> Path:
    """The BorderLines data directory of the ``territories`` option (a directory, or its
    ``disputed_territories.csv``; None: the packaged copy)."""
    root = Path(path) if path else PACKAGED
    return root.parent if root.is_file() else root


def load_borderlines(territories: str | os.PathLike | None = None) -> BorderLines:
    """The BorderLines table, countries and queries (``territories``: a BorderLines data
    directory, or its ``disputed_territories.csv``; default: the packaged copy)."""
    return _load_borderlines(str(territory_root(territories).resolve()))


def borderlines_of(opts: Options | None) -> BorderLines:
    """The BorderLines table the options name (``territories``; None: the packaged copy)."""
    return load_borderlines(opts.territories if opts is not None else None)


# ======================================================================================
# BordIRLines hub layout: queries.tsv, hits, docs
# ======================================================================================


def stamp(path: Path) -> tuple[str, int, int]:
    """(resolved path, mtime, size): the cache key of a file's content."""
    st = path.stat()
    return str(path.resolve()), st.st_mtime_ns, st.st_size


_QUERY_COLS = ("query_id", "query_text", "territory", "language")
_HIT_COLS = ("query_id", "territory", "rank", "score", "doc_id", "doc_lang")


def _tsv_rows(path: Path, cols: tuple[str, ...]) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = [c for c in cols if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; the header must be "
                             f"{chr(9).join(cols)!r} (tab separated)")
        return list(reader)


@functools.lru_cache(maxsize=4)
def _load_queries(file_stamp: tuple) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for row in _tsv_rows(Path(file_stamp[0]), _QUERY_COLS):
        lang = row["language"].strip()
        if lang == "control":  # the hub's name for the English control queries
            lang = "en"
        qid = row["query_id"].strip()
        if qid and qid not in out:
            out[qid] = {"query_id": qid, "text": row["query_text"],
                        "territory": row["territory"].strip(), "lang": lang}
    return out


def queries_file(data: str | os.PathLike) -> Path:
    """The ``queries.tsv`` of a hub-layout directory: ``<data>/queries.tsv``, or
    ``<data>/data/queries.tsv`` where the hub's writer (parse_search_results.py) puts it,
    next to ``all_docs.json`` and the hits."""
    top = Path(data) / "queries.tsv"
    nested = Path(data) / "data" / "queries.tsv"
    return nested if not top.is_file() and nested.is_file() else top


def load_queries(data: str | os.PathLike) -> dict[str, dict]:
    """``queries.tsv`` -> {query_id: {query_id, text, territory, lang}} in file order
    (language ``control`` is read as ``en``; a repeated query_id keeps its first row)."""
    return _load_queries(stamp(queries_file(data)))


def hits_paths(data: Path, lang: str, retriever: str, mode_dir: str) -> list[Path]:
    """Where the hub keeps the hits of the ``lang`` queries (the English control queries
    also under ``data/control/``)."""
    paths = [data / "data" / lang / retriever / mode_dir / f"{lang}_query_hits.tsv"]
    if lang == "en":
        paths.append(data / "data" / "control" / retriever / mode_dir / "control_query_hits.tsv")
    return paths


@functools.lru_cache(maxsize=64)
def _load_hits_file(file_stamp: tuple) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    path = Path(file_stamp[0])
    for line_no, row in enumerate(_tsv_rows(path, _HIT_COLS), 2):
        try:
            rank, score = int(row["rank"]), float(row["score"])
        except ValueError as e:
            raise ValueError(f"{path}:{line_no}: bad rank/score ({e})") from None
        out[row["query_id"].strip()].append(
            {"doc_id": row["doc_id"].strip(), "doc_lang": row["doc_lang"].strip(),
             "rank": rank, "score": score})
    for hits in out.values():
        hits.sort(key=lambda h: h["rank"])
    return dict(out)


@functools.lru_cache(maxsize=64)
def _merge_hits(stamps: tuple) -> dict[str, list]:
    merged: dict[str, list] = {}
    for file_stamp in stamps:
        for qid, hits in _load_hits_file(file_stamp).items():
            merged.setdefault(qid, hits)
    return merged


def load_hits(data: str | os.PathLike, lang: str, retriever: str, mode: str) -> dict[str, list]:
    """Hits of the ``lang`` queries in one mode: {query_id: [{doc_id, doc_lang, rank, score}]}
    sorted by rank (shared, cached lists: do not modify). For English,
    ``data/control/...`` adds the control queries that ``data/en/...`` does not have. A
    missing file is no hits."""
    paths = hits_paths(Path(data), lang, retriever, HITS_MODE.get(mode, mode))
    return _merge_hits(tuple(stamp(p) for p in paths if p.is_file()))


@functools.lru_cache(maxsize=2)
def _load_docs(file_stamp: tuple) -> dict[str, tuple[str, str]]:
    with open(file_stamp[0], encoding="utf-8") as f:
        obj = json.load(f)
    if not isinstance(obj, dict):
        raise ValueError(f"{file_stamp[0]}: expected a JSON object {{lang: {{doc_id: text}}}}")
    out: dict[str, tuple[str, str]] = {}
    for lang, docs in obj.items():
        if not isinstance(docs, dict):
            raise ValueError(f"{file_stamp[0]}: the value of {lang!r} must be {{doc_id: text}}")
        for doc_id, text in docs.items():
            out.setdefault(str(doc_id), (lang, text if isinstance(text, str) else str(text)))
    return out


def load_docs(path: str | os.PathLike) -> dict[str, tuple[str, str]]:
    """The passages JSON ``{lang: {doc_id: text}}`` -> {doc_id: (lang, text)}."""
    return _load_docs(stamp(Path(path)))


# ======================================================================================
# The hits a prompt shows, and the files the prompts depend on
# ======================================================================================


def query_index(opts: Options) -> dict[tuple[str, str], dict]:
    """(territory, lang) -> query row (the first in queries.tsv)."""
    return _query_index_of(stamp(queries_file(opts.data)), str(borderlines_of(opts).root))


@functools.lru_cache(maxsize=4)
def _query_index_of(file_stamp: tuple, root: str) -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}
    borderlines = load_borderlines(root)
    for query in _load_queries(file_stamp).values():
        territory = borderlines.territory(query["territory"])
        out.setdefault((territory.name if territory else query["territory"], query["lang"]),
                       query)
    return out


def shown_hits(opts: Options, mode: str, query: dict) -> tuple[list[dict] | None, str | None]:
    """The top-k hits a query's prompt shows in ``mode`` (not no_ir), or an error."""
    territory = borderlines_of(opts).territory(query["territory"])
    if territory is None:
        return None, f"territory {query['territory']!r} is not in the BorderLines table"
    source = query
    if mode == "swap":
        # The ablation's partner: the next claimant language (cyclically, in claimant order,
        # among languages that have a query of this territory), as in BordIRLines
        # generation_lib.get_other_lang.
        index = query_index(opts)
        langs = [lang for lang in territory.langs() if (territory.name, lang) in index]
        if query["lang"] not in langs:
            return None, (f"swap: {query['lang']} is not a claimant language of "
                          f"{territory.name} (claimant languages: {', '.join(langs) or 'none'})")
        if len(langs) < 2:
            return None, f"swap: {territory.name} has only one claimant language ({langs[0]})"
        other = langs[(langs.index(query["lang"]) + 1) % len(langs)]
        source = index[(territory.name, other)]
    hits = load_hits(opts.data, source["lang"], opts.retriever, mode).get(
        source["query_id"])
    if not hits:
        where = f" (the swap partner {source['query_id']})" if source is not query else ""
        return None, (f"no {opts.retriever} {HITS_MODE[mode]} hits for "
                      f"{source['query_id']}{where}")
    return hits[: opts.k], None


def input_files(opts: Options) -> list[str]:
    """The local files the prompts depend on (for input fingerprints)."""
    data = Path(opts.data)
    root = borderlines_of(opts).root
    files = [queries_file(data), root / "disputed_territories.csv",
             root / "countries_info.json", root / "queries" / "prompts_q_mc.txt",
             root / "queries" / "choices.txt"]
    for lang in opts.langs:
        files += [root / "queries" / f"prompts.{lang}", root / "queries" / f"choices.{lang}"]
    modes = [m for m in opts.modes if m != "no_ir"]
    if modes and opts.docs:
        files.append(Path(opts.docs))
    if "swap" in modes:  # the swap partner can be any claimant language
        hit_langs = sorted({q["lang"] for q in load_queries(data).values()})
    else:
        hit_langs = list(opts.langs)
    for mode in modes:
        for lang in hit_langs:
            files += hits_paths(data, lang, opts.retriever, HITS_MODE[mode])
    return sorted(dict.fromkeys(str(p) for p in files if p.is_file()))
