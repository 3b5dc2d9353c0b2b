"""translate's language check in `flag` mode (issue 45), through the real Translator actor
(CTranslate2, the tiny NLLB model, lingua): a document that looks like another language is
translated anyway and keeps the finding in `lang_flag` (no error); `error` drops it as an
error row, as before; a corpus's own lang_check overrides the section's per direction."""

from __future__ import annotations

import pyarrow as pa

from xling.actors.translator import Translator
from xling.tasks.languages import LANGUAGES, lingua_language

GOOD = ("Helsinki on Suomen pääkaupunki ja suurin kaupunki. Se sijaitsee Suomenlahden "
        "rannalla. Kaupungissa asuu noin 660 000 ihmistä.")
RUSSIAN = ("Москва — столица России, город федерального значения, административный центр "
           "Центрального федерального округа и центр Московской области, в состав которой не "
           "входит. Крупнейший по численности населения город России.")


def _batch(cells: list[int]) -> pa.Table:
    n = 2 * len(cells)
    return pa.table({"_rid": [f"r{i}" for i in range(n)],
                     "_cell": [c for c in cells for _ in (0, 1)],
                     "_shard": [0] * n, "id": [f"{k}{c}" for c in cells for k in ("good", "ru")],
                     "kind": ["doc"] * n, "title": [None] * n,
                     "text": [t for _ in cells for t in (GOOD, RUSSIAN)],
                     "error": pa.array([None] * n, pa.string())})


def test_flag_translates_and_keeps_the_finding_error_drops(tiny_models):
    lingua = sorted({n for n in (lingua_language(c) for c in LANGUAGES) if n})
    directions = [("fi", "fin_Latn", "en", "eng_Latn"), ("fi", "fin_Latn", "de", "deu_Latn")]
    translator = Translator(tiny_models["nllb_ct2"], model_name="tiny", directions=directions,
                            device="cpu", beam_size=1, max_decode_tokens=16,
                            lang_check="error", lang_checks=["flag", "error"],
                            lingua_names=lingua, lingua_expected={"fi": "FINNISH"})
    rows = {r["id"]: r for r in translator(_batch([0, 1])).to_pylist()}
    flagged, dropped = rows["ru0"], rows["ru1"]
    assert flagged["error"] is None and flagged["text"]  # translated anyway (flag)
    assert flagged["lang_flag"].startswith("wrong language") and "Russian" in flagged["lang_flag"]
    assert dropped["text"] is None and dropped["error"].startswith("wrong language")
    assert dropped["lang_flag"] is None
    for good in ("good0", "good1"):
        assert rows[good]["error"] is None and rows[good]["lang_flag"] is None
