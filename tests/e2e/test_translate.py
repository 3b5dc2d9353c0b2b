"""The translate stage, end to end, through the real `xling` CLI: CTranslate2 (tiny NLLB),
the text layer (sentencex), lingua, local Ray, and the run root on the SeaweedFS S3 server.

- documents (DT): every input document gets exactly one row per target language, with its
  sentence count and order preserved (checked against bare CTranslate2, sentence by sentence);
- topics (QT): rows keyed by query_id, the model converted from a Transformers checkpoint
  into the run store once and reused;
- bad input: error rows, counted, and the job goes on; bad configs stop before any work.

The DT run is the `xling translate` process a user starts; the QT runs, the bad records and
the bad configs call the same CLI entry point in the test process (on its Ray), where the
process itself is not what is checked. A translate job killed mid-corpus and resumed:
tests/faults/test_stage_kills.py.
"""

import json
import os
import time
from pathlib import Path

import pytest

from helpers import MRTYDI_DOCS, here, ok_here, passages, run_ok, translate_cells
from xling.actors.segments import decode_limit, segment_document
from xling.core.status import read_cell
from xling.core.store import RunStore

ROOT = Path(__file__).resolve().parents[2]
TOPICS = ROOT / "data" / "demo" / "topics" / "topics.ciral-v1.0-sw-test-a.tsv"
LANGS = ["fi", "ru", "sw", "ja"]
TARGETS = ["en", "de"]


@pytest.fixture
def s3_root(s3_env):
    return f"s3://xling-test/translate-{os.getpid()}-{int(time.time() * 1000)}"


def test_documents_and_topics_on_s3(tmp_path, s3_root, s3_env, tiny_models, ray_local):
    import ctranslate2
    from tokenizers import Tokenizer

    from xling.tasks.text import sentences as text_sentences

    # The corpus itself lives in S3, as on a cluster: read from S3, written to S3.
    corpus = RunStore(f"{s3_root}-corpus")
    for lang in LANGS:
        corpus.write_bytes(f"{lang}/corpus.jsonl.gz",
                           Path(MRTYDI_DOCS.replace("{lang}", lang)).read_bytes())
    cfg = tmp_path / "dt.yaml"
    cfg.write_text(f"""
name: dt
run_root: {s3_root}
ray: {{num_cpus: 2}}
translate:
  model: tiny:nllb_ct2
  beam_size: 1
  shards: 3
  parallel: {{concurrency: [1, 1], batch_size: 8}}
  documents:
    - name: mrtydi
      format: mrtydi
      path: {corpus.url()}/{{lang}}/*.jsonl.gz
      langs: {LANGS}
      targets: {TARGETS}
""")
    run_ok("translate", "--config", str(cfg), env=s3_env)
    store = RunStore(s3_root)
    cells = translate_cells(store)
    assert set(cells) == {("mrtydi", s, t) for s in LANGS for t in TARGETS}
    plan = store.read_json(f"{cells[('mrtydi', 'fi', 'en')]}/_plan.json")
    assert plan["inputs"] == [f"{corpus.url()}/fi/corpus.jsonl.gz"]

    model = tiny_models["nllb_ct2"]
    engine = ctranslate2.Translator(model, device="cpu", intra_threads=1)
    tok = Tokenizer.from_file(f"{model}/tokenizer.json")
    matched = compared = 0
    for (_, src, tgt), d in sorted(cells.items()):
        docs = {d["docid"]: d for d in passages(src)}
        table = read_cell(store, d).to_pylist()
        ids = [r["id"] for r in table]
        assert sorted(ids) == sorted(docs), "exactly one row per input document"
        manifest = store.read_json(f"{d}/_manifest.json")
        assert manifest["rows"] == len(docs) and manifest["errors"] == 0
        for row in table:
            assert row["error"] is None and row["text"]
            assert (row["kind"], row["src_lang"], row["tgt_lang"]) == ("doc", src, tgt)
            assert (row["model"], row["beam_size"]) == ("tiny:nllb_ct2", 1)
            assert row["segmenter"].startswith("sentencex-")  # the text layer's fingerprint
            paras = segment_document(docs[row["id"]]["text"], lambda p: text_sentences(p, src))
            sentences = [s for p in paras for s in p]
            assert row["n_segments"] == len(sentences) == len(row["segments"])
            # Paragraph breaks survive: one output line per input paragraph.
            assert row["text"].count("\n") == len(paras) - 1
            # Order: the k-th output segment is the k-th sentence translated on its own.
            for k, sent in enumerate(sentences[:4]):
                toks = tok.encode(sent, add_special_tokens=False).tokens
                if len(toks) > 200:
                    continue  # split into pieces; covered by the reassembly unit test
                own = decode_limit(len(toks), 2.0, 10, 512)
                hyp = engine.translate_batch(
                    [[f"{src_nllb(src)}", *toks, "</s>"]], target_prefix=[[src_nllb(tgt)]],
                    beam_size=1, max_decoding_length=own + 1, max_input_length=0,
                    return_end_token=True)[0].hypotheses[0][1:]
                hyp = [t for t in hyp if t != "</s>"][:own]
                ids_ = [tok.token_to_id(t) for t in hyp]
                want = tok.decode([i for i in ids_ if i is not None], skip_special_tokens=True).strip()
                compared += 1
                matched += row["segments"][k] == want
    # Batched and single-sentence float GEMMs may round differently, which can flip a greedy
    # step of a random-ish tiny model now and then; a shuffled order would match ~never.
    assert compared > 50 and matched / compared > 0.8, (matched, compared)

    # QT: topics keyed by query_id; a Transformers checkpoint is converted into the store.
    qt = tmp_path / "qt.yaml"
    qt.write_text(f"""
name: qt
run_root: {s3_root}
ray: {{num_cpus: 2}}
translate:
  model: tiny:nllb_hf
  quantization: int8
  shards: 2
  parallel: {{concurrency: [1, 1], batch_size: 32}}
  topics:
    - name: ciral
      path: {TOPICS}
      langs: [en]
      targets: [sw, yo]
""")
    # The QT runs in this process (the CLI process is checked by the DT run above).
    out = ok_here("translate", "--config", str(qt), "-v")
    assert "converting tiny:nllb_hf to CTranslate2 (int8)" in out
    marker = store.read_json("_models/ct2/nllb_hf-int8/_xling_ct2.json")
    assert marker["quantization"] == "int8" and "model.bin" in marker["files"]
    topics = dict(l.split("\t", 1) for l in TOPICS.read_text(encoding="utf-8").splitlines())
    for tgt in ("sw", "yo"):
        table = read_cell(store, translate_cells(store)[("ciral", "en", tgt)]).to_pylist()
        assert sorted(r["id"] for r in table) == sorted(topics)
        assert all(r["kind"] == "query" and r["error"] is None and r["text"] for r in table)
        assert all(r["compute_type"].startswith("int8") for r in table)
    # A second run with more targets reuses the conversion and the finished cells.
    out = ok_here("translate", "--config", str(qt), "translate.topics.0.targets=[sw, yo, ha]",
                  "-v")
    assert "converting" not in out and out.count("done earlier") == 2
    assert ("ciral", "en", "ha") in translate_cells(store)


def src_nllb(code: str) -> str:
    from xling.tasks.languages import nllb_code

    return nllb_code(code)


LONG_SENTENCE = " ".join(f"sana{i % 97}" for i in range(14_000))[:100_000]
GOOD = ("Helsinki on Suomen pääkaupunki ja suurin kaupunki. Se sijaitsee Suomenlahden "
        "rannalla. Kaupungissa asuu noin 660 000 ihmistä.")
RUSSIAN = ("Москва — столица России, город федерального значения, административный центр "
           "Центрального федерального округа и центр Московской области, в состав которой не "
           "входит. Крупнейший по численности населения город России.")


def test_bad_records_become_error_rows_and_the_job_goes_on(tmp_path, tiny_models, ray_local):
    corpus = tmp_path / "bad.jsonl"
    lines = [json.dumps({"docid": "good", "title": "Helsinki", "text": GOOD}).encode(),
             json.dumps({"docid": "empty", "title": "x", "text": ""}).encode(),
             json.dumps({"docid": "blank", "title": "x", "text": " \n\t \n "}).encode(),
             json.dumps({"docid": "long", "title": None, "text": LONG_SENTENCE}).encode(),
             json.dumps({"docid": "wronglang", "title": "Москва", "text": RUSSIAN},
                        ensure_ascii=False).encode(),
             b'{"docid": "badutf8", "title": "x", "text": "caf\xe9 \xff"}',
             b'{"docid": "truncated", "text": ']
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    cfg = tmp_path / "bad.yaml"
    run_root = tmp_path / "run"
    cfg.write_text(f"""
name: bad
run_root: {run_root}
ray: {{num_cpus: 2}}
translate:
  beam_size: 1
  shards: 2
  parallel: {{concurrency: [1, 1], batch_size: 4}}
  documents:
    - {{name: c, format: jsonl, path: {corpus}, langs: [fi], targets: [en]}}
""")
    ok_here("translate", "--config", str(cfg))
    store = RunStore(str(run_root))
    [d] = translate_cells(store).values()
    rows = {r["id"]: r for r in read_cell(store, d).to_pylist()}
    assert len(rows) == len(lines)
    assert rows["good"]["error"] is None and rows["good"]["n_segments"] == 3
    assert "empty text" in rows["empty"]["error"] and "empty text" in rows["blank"]["error"]
    assert "wrong language" in rows["wronglang"]["error"] and "Russian" in rows["wronglang"]["error"]
    errors = [r["error"] for r in rows.values() if r["error"]]
    assert any("invalid UTF-8" in e for e in errors) and any("malformed JSON" in e for e in errors)
    long = rows["long"]  # one 100,000-character "sentence": split, translated, reassembled
    assert long["error"] is None and long["n_segments"] == 1 and long["text"]
    assert long["n_src_tokens"] > 200 * 10
    assert store.read_json(f"{d}/_manifest.json")["errors"] == len(lines) - 2


def test_bad_configs_stop_before_any_work(tmp_path):
    """Config errors, in this process (no Ray starts; the CLI's exit code and message are
    those `xling translate` gives)."""
    def check(extra: str, *expect: str):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"""
name: c
run_root: {tmp_path / 'run'}
translate:
{extra}""")
        p = here("translate", "--config", str(cfg))
        assert p.returncode == 2, p.stderr
        for e in expect:
            assert e in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and not (tmp_path / "run").exists()

    docs = f"{ROOT}/data/demo/mrtydi/{{lang}}.jsonl.gz"
    check(f"  documents: [{{name: m, path: '{docs}', langs: [fi], targets: [en, xq]}}]",
          "translate.documents[0].targets", "Unknown language code: 'xq'")
    check(f"  documents: [{{name: m, path: '{docs}', langs: [fi], targets: [fin_Latn]}}]",
          "translates a language into itself")
    check(f"  documents: [{{name: m, path: '{docs}', langs: [fi, de], targets: [en]}}]",
          "no files match", "'de'")
    check("  beam_size: 2\n", "translate needs `documents:` or `topics:`")
    check(f"  model: tiny:nope\n  documents: [{{name: m, path: '{docs}', langs: [fi], targets: [en]}}]",
          "unknown tiny model")
    check(f"  beam: 2\n  documents: [{{name: m, path: '{docs}', langs: [fi], targets: [en]}}]",
          "did you mean 'beam_size'")
    # A model that cannot be had (offline here) stops the job before Ray starts.
    cfg = tmp_path / "m.yaml"
    cfg.write_text(f"""
name: m
run_root: {tmp_path / 'run2'}
translate:
  model: facebook/nllb-200-distilled-600M
  documents: [{{name: m, path: '{docs}', langs: [fi], targets: [en]}}]
""")
    p = here("translate", "--config", str(cfg), env={"HF_HUB_OFFLINE": "1"})
    assert p.returncode == 2 and "translate.model: cannot convert" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "run2" / "translate").exists()


@pytest.mark.parametrize("name", ["translate-clef2003.yaml", "translate-ciral.yaml", "demo.yaml"])
def test_study_configs_validate(name):
    from xling.config import load_config

    tc = load_config(ROOT / "configs" / name).translate
    pairs = {(s.name, a, b) for s in [*tc.documents, *tc.topics] for a in s.langs for b in s.targets}
    assert pairs and all(a != b for _, a, b in pairs)
    if name == "translate-clef2003.yaml":  # the directions the CLEF 2003 DT runs need
        assert {(src, tgt) for _, src, tgt in pairs} >= {
            ("fi", "en"), ("it", "en"), ("ru", "en"), ("de", "en"), ("it", "de"), ("ru", "de"),
            ("fi", "de"), ("it", "fi"), ("ru", "fi")}
