"""Cuts the mLongRR fixtures out of the shared CSVs: the header and the 2k rows of each file,
record for record unchanged (the 2k rows come first, so each fixture is a byte prefix of its
source; this script checks that).

Run from the repository root: `python tests/data/mlongrr/make_fixture.py [SHARED_MLONGRR]`
(default `../shared/data/mlongrr`, or $XLING_SHARED_DATA/mlongrr). Deterministic; see README.md.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
FILES = {  # path under the shared mlongrr folder -> git blob of the source (spec s1.8)
    "1-needle/English_needles.csv": "5621e6def254d024c2ec923024ff3c3ba6c31bbf",
    "1-needle/Swahili_needles.csv": "d41b73d5d125f7fef08b712dbfa2579a43747fa7",
    "3-needles/English_needles.csv": "c82c425af7fd55c12bd22b530654aac53086ca06",
}
KEEP_LENGTHS = ("2k",)


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def cut(data: bytes) -> bytes:
    csv.field_size_limit(2**31 - 1)
    rows = list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))
    kept = [rows[0]] + [r for r in rows[1:] if r[0] in KEEP_LENGTHS]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(kept)
    out = buf.getvalue().encode("utf-8")
    if not data.startswith(out):
        raise SystemExit("the kept rows are not a byte prefix of the source: rows reordered?")
    return out


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        src = Path(argv[1])
    elif os.environ.get("XLING_SHARED_DATA"):
        src = Path(os.environ["XLING_SHARED_DATA"]) / "mlongrr"
    else:
        src = REPO.parent / "shared" / "data" / "mlongrr"
    for rel, blob in FILES.items():
        data = (src / rel).read_bytes()
        if git_blob(data) != blob:
            raise SystemExit(f"{src / rel}: blob {git_blob(data)} is not the expected {blob}")
        out = cut(data)
        dest = HERE / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(out)
        print(f"{rel}: {len(out):,} bytes, sha256 {hashlib.sha256(out).hexdigest()}")


if __name__ == "__main__":
    main(sys.argv)
