"""actors/lucene.write_json_collection: the JsonCollection lines Anserini reads are
json.dumps's, byte for byte, though Arrow kernels build them."""

import json
import random

import pyarrow as pa
import pytest

from xling.actors import lucene

# Everything JSON escapes (quote, backslash, every control character), and what it does not:
# DEL, U+2028, non-BMP and CJK text, a slash, a backslash-u that is text.
ALPHABET = ['a', 'é', '"', '\\', '\n', '\r', '\t', '\b', '\f', '\x00', '\x01', '\x1b', '\x1f',
            '\x7f', '\u2028', '😀', '中', ' ', '/', '\\u00e9', 'ñ']


def expected(pairs) -> bytes:
    return "".join(json.dumps({"id": i, "contents": c}, ensure_ascii=False) + "\n"
                   for i, c in pairs).encode()


def written(folder) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.iterdir()))


@pytest.mark.parametrize("limit", [lucene._STRING_LIMIT, 0])  # 32- and 64-bit offsets
def test_lines_equal_json_dumps(tmp_path, monkeypatch, limit):
    monkeypatch.setattr(lucene, "_STRING_LIMIT", limit)
    rnd = random.Random(7)
    pairs = [("".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(1, 6))),
              "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 40))))
             for _ in range(2000)]
    assert lucene.write_json_collection(pairs, str(tmp_path / "pairs")) == len(pairs)
    assert written(tmp_path / "pairs") == expected(pairs)
    arrays = (pa.array([p[0] for p in pairs]), pa.chunked_array([[p[1] for p in pairs]]))
    assert lucene.write_json_collection(arrays, str(tmp_path / "arrow"), per_file=300) == 2000
    assert len(list((tmp_path / "arrow").iterdir())) == 7
    assert written(tmp_path / "arrow") == expected(pairs)
    # plain text takes the path without control-character escapes
    plain = [(f"d{i}", f"ein {i}. satz") for i in range(5)]
    assert lucene.write_json_collection(plain, str(tmp_path / "plain")) == 5
    assert written(tmp_path / "plain") == expected(plain)


def test_empty_and_null(tmp_path):
    assert lucene.write_json_collection([], str(tmp_path / "none")) == 0
    assert list((tmp_path / "none").iterdir()) == []
    with pytest.raises(ValueError, match="null contents"):
        lucene.write_json_collection((pa.array(["a"]), pa.array([None], pa.string())),
                                     str(tmp_path / "null"))
