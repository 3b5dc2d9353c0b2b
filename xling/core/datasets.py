"""Standard topics, qrels and hub datasets by name, fetched once into the run store.

A config may name an input instead of giving its file:

- `irds:<id>`: an ir_datasets dataset, for topics and qrels
  (`irds:neuclir/1/{lang}/trec-2022` with `fields: [ht_title]`, `irds:miracl/sw/dev`);
- `pyserini:<name>`: a pyserini topics or qrels name (`pyserini:ciral-v1.0-ha-test-a`);
- `hf:<owner>/<name>[@revision][/path]`: a dataset on the Hugging Face hub, for a study's
  data options (`study.options.data: hf:AmazonScience/XRAG/xrag.test.jsonl`) and corpus
  paths.

Names are resolved when the config is validated, before any stage runs. Each is read
through its own library, which reads its cache or downloads into it, and written into the
run store under `_data/`: topics as `qid<TAB>text` TSV, qrels as TREC qrels, hub files as
they are. The config then points at those files, so every stage and worker reads them like
any other input. A later run finds them in the store and never asks the library or the hub
again, so a run keeps the revision it first fetched (delete `_data/...` to refetch).
"""

from __future__ import annotations

import difflib
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

from xling.core.config import ConfigError, check_lang
from xling.core.store import RunStore

DATA = "_data"
TOPIC_SCHEMES = ("irds", "pyserini")
HUB_MARKER = "_FETCHED.json"


def named(value) -> tuple[str, str] | None:
    """("irds", "miracl/sw/dev") for "irds:miracl/sw/dev"; None for a path."""
    if isinstance(value, str):
        scheme, sep, name = value.partition(":")
        if sep and scheme in (*TOPIC_SCHEMES, "hf") and name:
            return scheme, name
    return None


def resolve_named(data: dict) -> None:
    """Rewrite the named inputs of a raw config dict, in place, into run-store files."""
    if not isinstance(data, dict):
        return
    topics = list(_specs(data, _TOPIC_LISTS, "topics"))
    corpora = [(w, s) for w, s in _specs(data, _CORPUS_LISTS, "corpus")
               if named(s.get("path"))]
    study = data.get("study")
    options = study.get("options") if isinstance(study, dict) else None
    hub = [k for k, v in (options or {}).items() if (named(v) or ("",))[0] == "hf"]
    if not any(named(s.get("path")) or named(s.get("qrels")) for _, s in topics) \
            and not hub and not corpora:
        return
    store = RunStore(data.get("run_root") or f"./runs/{data.get('name')}")
    for where, spec in topics:
        _resolve_topics(store, spec, where)
    for where, spec in corpora:
        scheme, name = named(spec["path"])
        if scheme != "hf":
            raise ConfigError(f"{where}.path: documents by name come from the hub "
                              f"(hf:<owner>/<name>/<file>); {scheme}: names topics and qrels")
        # Workers read documents themselves, so they get the store's URL, not a local copy.
        spec["path"] = hub_path(store, name, f"{where}.path", local=False)
    for key in hub:
        options[key] = hub_path(store, options[key][3:], f"study.options.{key}")


# Where a config lists topic sets and corpora: (section, list key).
_TOPIC_LISTS = (("retrieve", "topics"), ("translate", "topics"))
_CORPUS_LISTS = (("ingest", "corpora"), ("translate", "documents"), ("index", "collections"))


def _specs(data: dict, lists, rerank_key: str) -> Iterator[tuple[str, dict]]:
    for section, key in lists:
        sec = data.get(section)
        if isinstance(sec, dict) and isinstance(sec.get(key), list):
            for i, spec in enumerate(sec[key]):
                if isinstance(spec, dict):
                    yield f"{section}.{key}[{i}]", spec
    rr = data.get("rerank")
    if isinstance(rr, dict) and isinstance(rr.get("runs"), list):
        for i, run in enumerate(rr["runs"]):
            if isinstance(run, dict) and isinstance(run.get(rerank_key), dict):
                yield f"rerank.runs[{i}].{rerank_key}", run[rerank_key]


def _langs(values) -> list[str] | None:
    try:
        return [check_lang(v) for v in values]
    except (TypeError, ValueError):
        return None  # the config's own validation names the bad code


def _resolve_topics(store: RunStore, spec: dict, where: str) -> None:
    langs = _langs(spec.get("langs") or [])
    doc_langs = _langs(spec.get("doc_langs") or [None]) if spec.get("doc_langs") else [None]
    if not langs or doc_langs is None:
        return
    combos = [(ql, dl) for ql in langs for dl in doc_langs]
    ref = named(spec.get("path"))
    if ref:
        scheme, name = ref
        if scheme == "hf":
            raise ConfigError(f"{where}.path: hf: names a hub dataset for a study's options; "
                              "name topics with irds:<ir_datasets id> or pyserini:<topics name>")
        if spec.get("format", "tsv") != "tsv":
            raise ConfigError(f"{where}.format: a named topic set ({scheme}:) has no format; "
                              "remove `format:`")
        fields = spec.pop("fields", None)
        if fields is not None and (not isinstance(fields, list) or not fields):
            raise ConfigError(f"{where}.fields: a list of query field names, e.g. [ht_title]")
        rel = f"{DATA}/topics/{scheme}/{name}/{'+'.join(fields) if fields else 'default'}.tsv"
        spec["path"] = _materialize(store, rel, name, combos, lambda n: "".join(
            f"{q}\t{t}\n" for q, t in _TOPICS[scheme](n, fields, where)).encode())
    qref = named(spec.get("qrels"))
    if qref:
        scheme, name = qref
        if scheme == "hf":
            raise ConfigError(f"{where}.qrels: name qrels with irds:<id> or pyserini:<name>")
        spec["qrels"] = _materialize(store, f"{DATA}/qrels/{scheme}/{name}/qrels.txt", name,
                                     combos, lambda n: _QRELS[scheme](n, f"{where}.qrels"))


def _materialize(store: RunStore, rel: str, name: str, combos, make) -> str:
    """Write `make(name)` at `rel` for every (lang, doc_lang) the templates expand to, unless
    the store has it already; return the store URL of the template."""
    for ql, dl in combos:
        path = _fill(rel, ql, dl)
        if not store.exists(path):
            store.write_bytes(path, make(_fill(name, ql, dl)))
    return store.url(rel)


def _qrels_text(rows) -> bytes:
    """(query_id, doc_id, relevance) triples -> TREC qrels."""
    return "".join(f"{q} Q0 {d} {int(r)}\n" for q, d, r in rows).encode()


def _fill(template: str, lang: str, doc_lang: str | None) -> str:
    out = template.replace("{lang}", lang)
    return out.replace("{doc_lang}", doc_lang) if doc_lang else out


def _unknown(ref: str, what: str, names, where: str) -> ConfigError:
    close = difflib.get_close_matches(ref.split(":", 1)[1], list(names), n=5, cutoff=0.5)
    return ConfigError(f"{where}: '{ref}' is not {what}"
                       + (f"; close: {', '.join(close)}" if close else ""))


def _one_line(text) -> str:
    """The text as the library gives it, on one TSV line (tabs and line breaks -> spaces)."""
    return re.sub(r"[\t\r\n]+", " ", str(text or "")).strip()


# ---------------------------------------------------------------------------------------
# ir_datasets


def _irds(name: str, where: str):
    import ir_datasets

    try:
        return ir_datasets.load(name)
    except KeyError:
        raise _unknown(f"irds:{name}", "an ir_datasets id (https://ir-datasets.com)",
                       ir_datasets.registry._registered, where) from None


def _irds_failed(name: str, what: str, where: str, e: Exception) -> ConfigError:
    from ir_datasets.util import home_path

    return ConfigError(f"{where}: cannot read the {what} of irds:{name}: {e}. ir_datasets keeps "
                       f"its files under {home_path()} (IR_DATASETS_HOME): run once where it "
                       "can download them, or copy them there")


def _irds_topics(name: str, fields: list[str] | None, where: str) -> list[tuple[str, str]]:
    ds = _irds(name, f"{where}.path")
    if not ds.has_queries():
        raise ConfigError(f"{where}.path: irds:{name} has no queries")
    known = [f for f in ds.queries_cls()._fields if f != "query_id"]
    bad = [f for f in fields or [] if f not in known]
    if bad:
        raise ConfigError(f"{where}.fields: {bad} are not fields of irds:{name}'s queries; "
                          f"choose from {known}")
    try:
        return [(q.query_id, _one_line(" ".join(str(getattr(q, f) or "") for f in fields)
                                       if fields else q.default_text()))
                for q in ds.queries_iter()]
    except Exception as e:  # noqa: BLE001 - download or parse failure, named with its fix
        raise _irds_failed(name, "queries", f"{where}.path", e) from None


def _irds_qrels(name: str, where: str) -> bytes:
    ds = _irds(name, where)
    if not ds.has_qrels():
        raise ConfigError(f"{where}: irds:{name} has no qrels")
    try:
        rows = [(q.query_id, q.doc_id, q.relevance) for q in ds.qrels_iter()]
    except Exception as e:  # noqa: BLE001
        raise _irds_failed(name, "qrels", where, e) from None
    return _qrels_text(rows)


# ---------------------------------------------------------------------------------------
# pyserini (Anserini's topic and qrels names, cached in ~/.cache/pyserini/topics-and-qrels)


def _pyserini(where: str):
    from xling.actors.lucene import start_jvm

    start_jvm()
    from pyserini.search import _base

    return _base


def _pyserini_failed(name: str, where: str, e: Exception) -> ConfigError:
    msg = str(e).splitlines()[0] if str(e) else repr(e)
    return ConfigError(f"{where}: cannot read pyserini:{name}: {msg}. Anserini caches topics and "
                       "qrels in ~/.cache/pyserini/topics-and-qrels (of the Java user.home): run "
                       "once where it can download them, or copy the files there")


def _pyserini_topics(name: str, fields: list[str] | None, where: str) -> list[tuple[str, str]]:
    base = _pyserini(where)
    if name not in base.topics_mapping:
        raise _unknown(f"pyserini:{name}", "a pyserini topics name", base.topics_mapping,
                       f"{where}.path")
    try:
        topics = base.get_topics(name)
    except Exception as e:  # noqa: BLE001
        raise _pyserini_failed(name, f"{where}.path", e) from None
    fields = fields or ["title"]
    known = sorted({k for t in topics.values() for k in t})
    bad = [f for f in fields if f not in known]
    if bad:
        raise ConfigError(f"{where}.fields: {bad} are not fields of pyserini:{name}; choose "
                          f"from {known}")
    return [(str(qid), _one_line(" ".join(str(t.get(f) or "") for f in fields)))
            for qid, t in sorted(topics.items(), key=lambda kv: str(kv[0]))]


def _pyserini_qrels(name: str, where: str) -> bytes:
    from xling.tasks.topics import iter_qrels

    base = _pyserini(where)
    if name not in base.qrels_mapping:
        raise _unknown(f"pyserini:{name}", "a pyserini qrels name", base.qrels_mapping, where)
    try:
        data = Path(base.get_qrels_file(name)).read_bytes()
    except Exception as e:  # noqa: BLE001
        raise _pyserini_failed(name, where, e) from None
    try:
        rows = list(iter_qrels(io.BytesIO(data)))
    except ValueError as e:
        raise ConfigError(f"{where}: pyserini:{name}: {e}") from None
    return _qrels_text((r["query_id"], r["doc_id"], r["relevance"]) for r in rows)


_TOPICS = {"irds": _irds_topics, "pyserini": _pyserini_topics}
_QRELS = {"irds": _irds_qrels, "pyserini": _pyserini_qrels}


# ---------------------------------------------------------------------------------------
# the Hugging Face hub

_HUB = re.compile(r"(?P<repo>[\w.-]+/[\w.-]+)(?:@(?P<rev>[\w.-]+))?(?:/(?P<sub>.+))?")


def hub_path(store: RunStore, ref: str, where: str, local: bool = True) -> str:
    """A local path (or with `local=False` the store's URL) to `owner/name[@rev][/sub]` of a
    hub dataset, from the run store's copy.

    The first call downloads what is needed (only `sub` when given) and copies it to
    `_data/hf/<owner>/<name>/<rev or main>/`; the marker there pins the commit, so a later
    call for another file of the same dataset fetches that commit, not a newer one.
    """
    m = _HUB.fullmatch(ref.strip("/"))
    if not m:
        raise ConfigError(f"{where}: 'hf:{ref}' is not hf:<owner>/<name>[@revision][/path]")
    repo, rev, sub = m["repo"], m["rev"], (m["sub"] or "").strip("/")
    rel = f"{DATA}/hf/{repo}/{rev or 'main'}"
    info = store.read_json_or_none(f"{rel}/{HUB_MARKER}") or {}
    have = set(info.get("files", []))
    if not (info.get("complete") or (sub and any(_under(f, sub) for f in have))):
        local = _snapshot(repo, info.get("revision") or rev, sub, where)
        new = sorted(str(p.relative_to(local)).replace(os.sep, "/")
                     for p in Path(local).rglob("*") if p.is_file())
        if sub:
            new = [f for f in new if _under(f, sub)]
            if not new:
                raise ConfigError(f"{where}: hf:{repo} has no file or folder '{sub}'")
        for f in new:
            if f not in have:
                store.write_bytes(f"{rel}/{f}", (Path(local) / f).read_bytes())
        info = {"repo": repo, "revision": Path(local).name, "requested": rev or "main",
                "files": sorted(have | set(new)), "complete": bool(info.get("complete")) or not sub}
        store.write_json(f"{rel}/{HUB_MARKER}", info)
    if not local:
        return store.url(f"{rel}/{sub}" if sub else rel)
    root = store.fetch_tree(rel, HUB_MARKER)
    return os.path.join(root, sub) if sub else root


def _under(path: str, sub: str) -> bool:
    """`path` is the file `sub` or inside the folder `sub` (repository paths, `/`)."""
    return path == sub or path.startswith(sub + "/")


def _snapshot(repo: str, rev: str | None, sub: str, where: str) -> str:
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo, repo_type="dataset", revision=rev,
                                 allow_patterns=[sub, f"{sub}/**"] if sub else None)
    except Exception as e:  # noqa: BLE001 - offline, gated or unknown: one line with the fix
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{where}: cannot fetch hf:{repo}{'@' + rev if rev else ''}: {msg}. "
                          f"Download it once where the hub is reachable (`hf download {repo} "
                          "--repo-type dataset`; `hf auth login` first if it is gated); "
                          "HF_HUB_CACHE holds the copy") from None
