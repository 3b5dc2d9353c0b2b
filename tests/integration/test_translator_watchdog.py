"""The translator's watchdog: a batch during which CTranslate2 finishes nothing for
`hang_timeout_s` gives error rows (rows that had failed already keep their own error), the
actor loads the model again, and the next batch translates. The real tiny NLLB model; the
hang is one batch of results that never complete, as a stuck CUDA call leaves them."""

import time

import pyarrow as pa

from xling.actors.translator import Translator

DIRECTIONS = [("fi", "fin_Latn", "en", "eng_Latn")]


class Stuck:
    """The engine for one batch: its results never complete; unloading it is recorded."""

    def __init__(self, real):
        self.real, self.unloaded = real, False

    def translate_batch(self, batch, **kw):
        class Never:
            def done(self):
                return False

        return [Never() for _ in batch]

    def unload_model(self):
        self.unloaded = True


def rows(texts):
    n = len(texts)
    return pa.table({"_cell": [0] * n, "id": [f"d{i}" for i in range(n)], "kind": ["doc"] * n,
                     "title": pa.nulls(n, pa.string()), "text": texts,
                     "error": pa.nulls(n, pa.string()), "_rid": [f"r{i}" for i in range(n)],
                     "_shard": [0] * n})


def test_a_hung_batch_fails_its_rows_and_the_model_is_loaded_again(tiny_models):
    t = Translator(tiny_models["nllb_ct2"], "tiny:nllb_ct2", DIRECTIONS, device="cpu",
                   beam_size=1, hang_timeout_s=0.5, lang_check="off")
    texts = ["Hyvää huomenta. Kissa istuu.", "", "Talo on punainen."]
    ok = t(rows(texts)).to_pylist()
    assert [r["error"] for r in ok] == [None, "empty text: nothing to translate", None]
    first = t.engine
    t.engine = stuck = Stuck(first)
    out = t(rows(texts)).to_pylist()
    assert out[1]["error"] == "empty text: nothing to translate"  # its own error, kept
    for r in (out[0], out[2]):
        assert r["text"] is None and r["error"].startswith(
            "translation engine hung: no progress for 0.5 s (translate.hang_timeout_s); this "
            "batch's rows failed and the engine was restarted"), r
    assert [r["_rid"] for r in out] == ["r0", "r1", "r2"]
    assert t.restarts == 1 and t.engine is not stuck
    for _ in range(500):  # unloaded on a side thread
        if stuck.unloaded:
            break
        time.sleep(0.01)
    assert stuck.unloaded
    again = t(rows(texts)).to_pylist()
    assert [r["text"] for r in again] == [r["text"] for r in ok]  # the reloaded model, same output
