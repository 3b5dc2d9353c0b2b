"""Document-line parsers on the real Mr.TyDi and NeuCLIR samples shipped in data/demo."""

import gzip
import json
from pathlib import Path

from xling.tasks.corpora import parse_document_line

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"


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
