"""Document-line parsers on the real Mr.TyDi and NeuCLIR samples shipped in data/demo."""

import gzip
import json
from pathlib import Path

from xling.tasks.corpora import parse_document_line

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"


def test_real_mrtydi_lines_parse():
    n = 0
    for f in sorted((DEMO / "mrtydi").glob("*.jsonl.gz")):
        lang = f.name.split(".")[0]
        for line in gzip.open(f, "rt", encoding="utf-8"):
            row = parse_document_line(line, fmt="mrtydi", lang=lang, source="mrtydi")
            raw = json.loads(line)
            assert row["error"] is None
            assert (row["doc_id"], row["title"], row["text"]) == (raw["docid"], raw["title"], raw["text"])
            assert row["lang"] == lang
            n += 1
    assert n == 44


def test_real_neuclir_lines_parse():
    lines = (DEMO / "neuclir-rus.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [parse_document_line(l, fmt="neuclir", lang="ru", source="neuclir") for l in lines]
    assert [r["doc_id"] for r in rows] == [json.loads(l)["id"] for l in lines]
    assert all(r["error"] is None and r["text"] for r in rows)
    assert [r["date"] for r in rows] == [json.loads(l)["time"] for l in lines]  # null in the sample


def test_bad_lines_become_error_rows_with_stable_ids():
    bad = '{"docid": "1#0", "title": "x", "text": '
    a = parse_document_line(bad, fmt="mrtydi", lang="fi", source="s")
    b = parse_document_line(bad, fmt="mrtydi", lang="fi", source="s")
    assert a["error"].startswith("malformed JSON") and a["doc_id"] == b["doc_id"]
    assert parse_document_line("[1, 2]", fmt="mrtydi", lang="fi", source="s")["error"].startswith("expected")
    assert "missing document id" in parse_document_line('{"title": "t", "text": "x"}', fmt="mrtydi",
                                                        lang="fi", source="s")["error"]
    empty = parse_document_line('{"docid": "7", "text": "  "}', fmt="mrtydi", lang="fi", source="s")
    assert empty["doc_id"] == "7" and empty["error"] == "empty text"
    assert parse_document_line("   \n", fmt="mrtydi", lang="fi", source="s") is None


def test_generic_jsonl_field_mapping():
    row = parse_document_line('{"pid": 5, "body": "Hei maailma."}', fmt="jsonl", lang="fi", source="s",
                              id_field="pid", title_field=None, text_field="body")
    assert (row["doc_id"], row["title"], row["text"], row["error"]) == ("5", None, "Hei maailma.", None)


# --- streaming readers ---------------------------------------------------------------------

import io  # noqa: E402
import os  # noqa: E402

import pytest  # noqa: E402

from xling.tasks.corpora import iter_documents, iter_parquet_documents  # noqa: E402
from xling.tasks.topics import clef_topic, iter_clef_topics, iter_qrels, iter_tsv_topics  # noqa: E402


def _shared_ir() -> Path | None:
    env = os.environ.get("XLING_SHARED_DATA")
    for c in ([Path(env)] if env else []) + [DEMO.parents[1].parent / "shared" / "data"]:
        if (c / "ir" / "topics").is_dir():
            return c / "ir"
    return None


IR = _shared_ir()
needs_ir = pytest.mark.skipif(IR is None, reason="shared/data/ir not found (set XLING_SHARED_DATA)")


class Trickle(io.RawIOBase):
    """A stream that hands out a few bytes per read, so records straddle chunk boundaries."""

    def __init__(self, data: bytes, step: int = 7):
        self.data, self.pos, self.step = data, 0, step

    def read(self, n=-1):
        out = self.data[self.pos: self.pos + min(self.step, n if n > 0 else self.step)]
        self.pos += len(out)
        return out


@pytest.mark.parametrize("lang", ["ar", "fi", "ja", "ru", "sw", "th"])
def test_streamed_mrtydi_gz_equals_line_parser(lang):
    path = DEMO / "mrtydi" / f"{lang}.jsonl.gz"
    with gzip.open(path, "rb") as f:
        streamed = list(iter_documents(f, fmt="mrtydi", lang=lang, source="m"))
    lines = gzip.open(path, "rt", encoding="utf-8").read().splitlines()
    assert streamed == [parse_document_line(l, fmt="mrtydi", lang=lang, source="m") for l in lines]


@needs_ir
def test_real_sample_docs_stream_from_shared_data():
    for path in sorted((IR / "sample-docs" / "mrtydi-1.1").glob("*/corpus.jsonl.gz")):
        with gzip.open(path, "rb") as f:
            rows = list(iter_documents(f, fmt="mrtydi", lang=path.parent.name, source="m"))
        assert rows and all(r["error"] is None and r["text"] for r in rows)
    neu = IR / "sample-docs" / "neuclir-rus" / "sample_rus_collection.jsonl"
    data = neu.read_bytes()
    rows = list(iter_documents(Trickle(data, 101), fmt="neuclir", lang="ru", source="n"))
    assert [r["doc_id"] for r in rows] == [json.loads(l)["id"] for l in data.decode().splitlines()]


def test_invalid_utf8_line_is_an_error_row_and_the_rest_is_read():
    data = (b'{"docid": "1", "title": "a", "text": "hyv\xc3\xa4"}\n'
            b'{"docid": "2", "title": "b", "text": "bad \xff\xfe byte"}\n'
            b'{"docid": "3", "title": "c", "text": "ok"}\n')
    rows = list(iter_documents(io.BytesIO(data), fmt="mrtydi", lang="fi", source="s"))
    assert [r["error"] is None for r in rows] == [True, False, True]
    assert "invalid UTF-8" in rows[1]["error"] and "line 2" in rows[1]["error"]
    assert rows[0]["text"] == "hyvä"


def test_parquet_with_a_column_mapping(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"pid": [1, 2, None], "head": ["T", None, "x"],
                             "body": ["Hello there.", "  ", "orphan"]}), tmp_path / "c.parquet")
    rows = list(iter_parquet_documents(str(tmp_path / "c.parquet"), lang="en", source_name="p",
                                       id_field="pid", title_field="head", text_field="body",
                                       batch_rows=2))
    assert [(r["doc_id"], r["title"], r["text"], r["error"]) for r in rows] == [
        ("1", "T", "Hello there.", None), ("2", None, "  ", "empty text"),
        ("bad-row:3", None, None, "missing document id field 'pid'")]
    with pytest.raises(ValueError, match="not found"):
        list(iter_parquet_documents(str(tmp_path / "c.parquet"), lang="en", source_name="p"))


# CLEF 2003 fixtures, written for the tests after the collections' DTDs: each newspaper has
# its own field tags (LA Times: HEADLINE/TEXT with <P>; Frankfurter Rundschau and Spiegel:
# TITLE/TEXT; SDA: TI/LD/TX; Aamulehti: TI/TE; Izvestia and La Stampa: TITLE/TEXT).
LATIMES = """<DOC>
<DOCNO> LA010194-0001 </DOCNO>
<DOCID> 1 </DOCID>
<DATE><P>January 1, 1994, Saturday, Home Edition</P></DATE>
<SECTION><P>Metro; Part B; Page 1</P></SECTION>
<HEADLINE><P>QUAKE &amp; AFTERSHOCKS JOLT REGION</P></HEADLINE>
<TEXT>
<P>A strong earthquake shook the region on Friday.</P>
<P>No injuries were reported.</P>
</TEXT>
</DOC>
"""
FR = """<DOC>
<DOCNO>FR940104-000001</DOCNO>
<DOCID>FR940104-000001</DOCID>
<DATE>940104</DATE>
<TITLE>Grüne fordern Ausstieg</TITLE>
<TEXT>Die Grünen haben am Montag den sofortigen Ausstieg gefordert. Die Regierung lehnte ab.</TEXT>
</DOC>
"""
SDA = """<DOC>
<DOCNO>SDA.940105.0042</DOCNO>
<DOCID>SDA.940105.0042</DOCID>
<KW>BRA</KW>
<TI>Großbrand in Zürich</TI>
<LD>Ein Großbrand hat in der Nacht ein Lagerhaus zerstört.</LD>
<TX>Die Feuerwehr war mit 80 Leuten im Einsatz.</TX>
</DOC>
"""
AAMU = """<DOC>
<DOCNO>aamu19940103-000012</DOCNO>
<DATE>19940103</DATE>
<TI>Pakkanen kiristyy</TI>
<TE>Pakkanen kiristyy koko maassa viikonloppuna. Lämpötila laskee alle kolmenkymmenen asteen.</TE>
</DOC>
"""
IZV = """<DOC>
<DOCNO>izv.1995.01.03.0007</DOCNO>
<TITLE>Новый год в Москве</TITLE>
<TEXT>Москва встретила Новый год салютом. Праздник прошёл спокойно.</TEXT>
</DOC>
"""


def _clef(data: bytes, **kw) -> list[dict]:
    return list(iter_documents(Trickle(data, 13), fmt="clef", lang=kw.pop("lang", "de"),
                               source="clef", **kw))


def test_clef_tag_sets_latin1_and_utf8():
    latin1 = (FR + SDA).encode("latin-1")
    utf8 = (LATIMES + AAMU + IZV).encode("utf-8")
    rows = _clef(latin1 + utf8)  # a mixed file: auto falls back to Latin-1 per <DOC>
    by_id = {r["doc_id"]: r for r in rows}
    assert list(by_id) == ["FR940104-000001", "SDA.940105.0042", "LA010194-0001",
                           "aamu19940103-000012", "izv.1995.01.03.0007"]
    assert all(r["error"] is None for r in rows)
    assert by_id["FR940104-000001"]["title"] == "Grüne fordern Ausstieg"
    assert by_id["FR940104-000001"]["date"] == "940104"
    assert by_id["SDA.940105.0042"]["title"] == "Großbrand in Zürich"
    assert by_id["SDA.940105.0042"]["text"] == ("Ein Großbrand hat in der Nacht ein Lagerhaus "
                                                "zerstört.\nDie Feuerwehr war mit 80 Leuten im Einsatz.")
    la = by_id["LA010194-0001"]
    assert la["title"] == "QUAKE & AFTERSHOCKS JOLT REGION"
    assert la["text"] == "A strong earthquake shook the region on Friday.\nNo injuries were reported."
    assert by_id["aamu19940103-000012"]["text"].startswith("Pakkanen kiristyy koko maassa")
    assert by_id["izv.1995.01.03.0007"]["title"] == "Новый год в Москве"
    # Strict UTF-8 turns the Latin-1 documents into error rows, keyed by their DOCNO.
    strict = {r["doc_id"]: r["error"] for r in _clef(latin1 + utf8, encoding="utf-8")}
    assert "invalid UTF-8" in strict["FR940104-000001"] and strict["LA010194-0001"] is None
    assert _clef(latin1, encoding="latin-1")[0]["title"] == "Grüne fordern Ausstieg"


def test_clef_gzip_many_files_and_malformed_documents(tmp_path):
    broken = ("<DOC>\n<TITLE>no number</TITLE><TEXT>Text ohne Nummer.</TEXT>\n</DOC>\n"
              "<DOC><DOCNO>EMPTY-1</DOCNO><TEXT>  </TEXT></DOC>\n"
              "<DOC><DOCNO>CUT-1</DOCNO><TEXT>abgeschnitten\n")  # then a new DOC starts
    data = gzip.compress((broken + FR + "<DOC><DOCNO>TRUNC-9</DOCNO><TEXT>ende").encode("utf-8"))
    with gzip.open(io.BytesIO(data), "rb") as f:
        rows = list(iter_documents(f, fmt="clef", lang="de", source="fr"))
    errors = {r["doc_id"]: r["error"] for r in rows}
    assert errors["FR940104-000001"] is None  # a broken document does not swallow the next
    assert errors["EMPTY-1"] == "empty text"
    assert "unterminated" in errors["CUT-1"] and "unterminated" in errors["TRUNC-9"]
    assert any(k.startswith("bad-line:") and v == "missing <DOCNO>" for k, v in errors.items())
    assert len(rows) == 5


CLEF_TOPICS = """<top>
<num> C141 </num>
<DE-title> Briefbombe für Kiesbauer </DE-title>
<DE-desc> Finde Informationen über die Explosion einer Briefbombe im Studio der Moderatorin Arabella Kiesbauer. </DE-desc>
<DE-narr> Relevante Dokumente berichten über die Explosion. </DE-narr>
</top>

<top>
<num> C142 </num>
<DE-title> Christo verhüllt den Reichstag </DE-title>
<DE-desc> Finde Berichte über die Verhüllung des Reichstags. </DE-desc>
<DE-narr> Relevant sind Berichte über die Planung. </DE-narr>
</top>
"""


def test_clef_topics_title_and_description():
    rows = list(iter_clef_topics(Trickle(CLEF_TOPICS.encode("latin-1"), 11), lang="de"))
    assert [r["query_id"] for r in rows] == ["C141", "C142"]
    assert rows[0]["text"] == ("Briefbombe für Kiesbauer Finde Informationen über die Explosion "
                               "einer Briefbombe im Studio der Moderatorin Arabella Kiesbauer.")
    assert rows[1]["narr"] == "Relevant sind Berichte über die Planung."
    title_only = list(iter_clef_topics(io.BytesIO(CLEF_TOPICS.encode()), lang="de", fields=("title",)))
    assert title_only[1]["text"] == "Christo verhüllt den Reichstag"
    # TREC style, tags not closed, with field labels.
    trec = clef_topic("<num> Number: 401\n<title> foreign minorities, Germany\n<desc> Description:\n"
                      "What language and cultural differences impede integration?\n<narr> Narrative: x",
                      lang="en")
    assert trec["query_id"] == "401"
    assert trec["text"] == ("foreign minorities, Germany What language and cultural differences "
                            "impede integration?")
    assert clef_topic("<DE-title> ohne Nummer </DE-title>", lang="de")["error"] == "topic without <num>"


def test_tsv_topics_real_file_and_bad_lines():
    path = DEMO / "topics" / "topics.ciral-v1.0-sw-test-a.tsv"
    rows = list(iter_tsv_topics(io.BytesIO(path.read_bytes()), lang="en"))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [(r["query_id"], r["text"]) for r in rows] == [
        (q, t.strip()) for q, t in (l.split("\t", 1) for l in lines)]
    assert all(r["error"] is None for r in rows)
    bad = list(iter_tsv_topics(io.BytesIO(b"1\tok\nno tab here\n2\t  \n3\t\xff\n\n"), lang="en"))
    assert [r["error"] for r in bad][0] is None
    assert "not `qid<TAB>text`" in bad[1]["error"] and bad[2]["error"] == "empty query text"
    assert "invalid UTF-8" in bad[3]["error"] and len(bad) == 4


@needs_ir
def test_real_topics_and_qrels_from_shared_data():
    n_topics = 0
    for path in sorted((IR / "topics").glob("*.tsv")):
        rows = list(iter_tsv_topics(io.BytesIO(path.read_bytes()), lang="en"))
        assert rows and all(r["error"] is None for r in rows), path.name
        n_topics += len(rows)
    assert n_topics > 1000
    qrels = sorted((IR / "qrels").glob("*"))
    assert qrels
    for path in qrels:
        rows = list(iter_qrels(io.BytesIO(path.read_bytes())))
        first = path.read_text(encoding="utf-8").split("\n", 1)[0].split()
        assert rows[0] == {"query_id": first[0], "doc_id": first[2], "relevance": int(first[3])}
        assert len(rows) == sum(1 for l in path.read_text(encoding="utf-8").splitlines() if l.strip())


def test_qrels_errors_name_the_line():
    with pytest.raises(ValueError, match="line 2 has 3 fields"):
        list(iter_qrels(io.BytesIO(b"1 Q0 d1 1\n1 Q0 d2\n")))
    with pytest.raises(ValueError, match="not an integer"):
        list(iter_qrels(io.BytesIO(b"1 Q0 d1 yes\n")))
