"""Check requirements-gpu.lock without a GPU: every shared library in the lock's wheels finds
the libraries it needs.

For the cluster image's platform (Linux x86_64, glibc 2.35, CPython 3.11) this picks each
pinned package's wheel on PyPI, reads every `.so` in it, and checks that
  - each soname it links (ELF DT_NEEDED) and
  - each CUDA library it opens at run time (dlopen: a name such as `libcublas.so.12` in its
    bytes; CTranslate2 and torch load cuBLAS, NCCL, NVRTC... this way, on first GPU use)
is provided by a library of some wheel in the lock or by the base image
(cluster/base-image-libs.txt), and that no two wheels install the same library. Plug-ins
that a package loads only for a feature xling never uses (the JVM's desktop libraries,
NVSHMEM's InfiniBand transports, video decoders) are listed with their reason in
cluster/gpu-lock-optional.txt and not checked. A run-time name listed in several versions
(`libnvrtc.so.12` and `.13`: the loader tries each) is met by any of them.

Wheels are read with HTTP range requests (only their `.so` members are fetched) and each
wheel's findings are cached by its sha256 under --cache, so a second run reads only the
package index. `make check-gpu-lock` runs it; `make lock-gpu` runs it after each re-lock.
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import json
import re
import struct
import sys
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

INDEX = "https://pypi.org/simple"
PY = (3, 11)
# manylinux_2_35_x86_64 and every older manylinux tag it accepts (glibc 2.35: Ubuntu 22.04).
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(35, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
TAGS = {t: i for i, t in enumerate([*cpython_tags(PY, platforms=PLATFORMS),
                                    *compatible_tags(PY, platforms=PLATFORMS)])}
# Libraries that CUDA code opens with dlopen (not DT_NEEDED): the driver, the CUDA toolkit's
# libraries and NCCL. Only these are checked among a binary's strings; other library names in
# a binary (MKL's CPU dispatch, optional profilers) are not run-time requirements.
CUDA_LIB = re.compile(
    rb"\b(lib(?:cuda|cudart|cublas|cublasLt|cudnn(?:_[a-z_]+)?|cufft|cufftw|curand|cusolver|"
    rb"cusparse|cusparseLt|nccl|nvrtc|nvrtc-builtins|nvJitLink|nvidia-ml|cupti|nvToolsExt|cufile|nvshmem_host)"
    rb"\.so(?:\.\d+)*)\x00")
SO = re.compile(r"\.so(\.[^/]+)?$")  # also libssl-81259c47.so.1.1.1k
HERE = Path(__file__).resolve().parent
ANALYSIS = 3  # bump when what `analyse` records changes: the cached findings are redone


# ---- the lock and the index ---------------------------------------------------------------

def pins(lock: Path) -> list[tuple[str, str]]:
    out = []
    for line in lock.read_text().splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = line.split("==", 1)
            out.append((canonicalize_name(name.split("[", 1)[0]), version.strip()))
    return out


def _get(url: str, headers: dict | None = None) -> bytes:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read()


def pick_wheel(name: str, version: str) -> dict | None:
    """The file pip would install on the image's platform: the best-ranked wheel, or None
    when the version has no wheel for it (an sdist, built at install)."""
    data = json.loads(_get(f"{INDEX}/{name}/",
                           {"Accept": "application/vnd.pypi.simple.v1+json"}))
    best = None
    for f in data["files"]:
        if not f["filename"].endswith(".whl") or f.get("yanked"):
            continue
        try:
            _, v, _, tags = parse_wheel_filename(f["filename"])
        except ValueError:  # an old, malformed name (pydantic-0.18-py36+-none-any)
            continue
        if str(v) != version and v.public != version:
            continue
        rank = min((TAGS[t] for t in tags if t in TAGS), default=None)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, f)
    return best[1] if best else None


class RangeFile(io.RawIOBase):
    """A remote file read with HTTP range requests in large chunks (zipfile seeks to the
    central directory, then reads each member's bytes in order)."""

    CHUNK = 16 << 20

    def __init__(self, url: str, size: int):
        self.url, self.size, self.pos = url, size, 0
        self.buf_start, self.buf = 0, b""

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = self.size - self.pos
        end = min(self.pos + n, self.size)
        if not (self.buf_start <= self.pos and end <= self.buf_start + len(self.buf)):
            stop = min(max(end, self.pos + self.CHUNK), self.size) - 1
            self.buf_start = self.pos
            self.buf = _get(self.url, {"Range": f"bytes={self.pos}-{stop}"})
        out = self.buf[self.pos - self.buf_start:end - self.buf_start]
        self.pos += len(out)
        return out


# ---- ELF ---------------------------------------------------------------------------------

DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 1, 5, 14, 15, 29


def elf_dynamic(data: bytes) -> dict | None:
    """SONAME, NEEDED and RUNPATH of a 64-bit little-endian ELF (None for anything else)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return {"soname": None, "needed": [], "runpath": []}
    entries, strtab = [], 0
    for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        if tag == DT_STRTAB:
            strtab = next(o + val - v for v, o, sz in loads if v <= val < v + sz)
        entries.append((tag, val))

    def string(at: int) -> str:
        return data[strtab + at:data.index(b"\x00", strtab + at)].decode()

    return {"soname": next((string(v) for t, v in entries if t == DT_SONAME), None),
            "needed": [string(v) for t, v in entries if t == DT_NEEDED],
            "runpath": [string(v) for t, v in entries if t in (DT_RPATH, DT_RUNPATH)]}


def analyse(wheel: dict, cache: Path) -> dict:
    """{member path: {soname, needed, runpath, dlopen}} for a wheel's shared libraries,
    cached by the wheel's sha256."""
    path = cache / f"{wheel['hashes']['sha256']}-v{ANALYSIS}.json"
    if path.is_file():
        return json.loads(path.read_text())
    libs = {}
    with zipfile.ZipFile(RangeFile(wheel["url"], wheel["size"])) as z:
        for info in z.infolist():
            if not SO.search(info.filename) or info.file_size < 64:
                continue
            data = z.read(info)
            dyn = elf_dynamic(data)
            if dyn is None:
                continue
            dyn["dlopen"] = sorted({m.decode() for m in CUDA_LIB.findall(data)})
            libs[info.filename] = dyn
    out = {"wheel": wheel["filename"], "libs": libs}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out


# ---- the check ---------------------------------------------------------------------------

def entries(path: Path) -> list[str]:
    """A list file's entries (comments and blank lines dropped)."""
    return [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()
            if line.split("#", 1)[0].strip()]


def optional(path: Path) -> list[tuple[str, str]]:
    """(package, member glob) of the plug-ins loaded only for features xling never uses."""
    return [tuple(e.split(None, 1)) for e in entries(path)]  # type: ignore[misc]


def stem(soname: str) -> str:
    return soname.split(".so", 1)[0]


def check(wheels: dict[str, dict], base: set[str],
          skip: list[tuple[str, str]] = ()) -> tuple[list[str], int]:
    """(one line per library a library needs or opens that nothing provides, and per shared
    library that two wheels install at the same path; how many optional plug-ins were not
    checked)."""
    provided: dict[str, str] = {name: "base image" for name in base}
    owner: dict[str, str] = {}
    problems = []
    for pkg, w in sorted(wheels.items()):
        for member, lib in w["libs"].items():
            for name in {lib["soname"] or member.rsplit("/", 1)[-1], member.rsplit("/", 1)[-1]}:
                provided.setdefault(name, pkg)
            if owner.setdefault(member, pkg) != pkg:
                problems.append(f"CLASH    {pkg}: {member} is also installed by "
                                f"{owner[member]}; the one installed last overwrites the other's")
    skipped = 0
    for pkg, w in sorted(wheels.items()):
        for member, lib in sorted(w["libs"].items()):
            if any(pkg == p and fnmatch.fnmatch(member, glob) for p, glob in skip):
                skipped += 1
                continue
            for need in lib["needed"]:
                if need not in provided:
                    problems.append(f"MISSING  {pkg}: {member} links {need}, which no wheel "
                                    "of the lock and nothing in the base image provides")
            by_stem: dict[str, list[str]] = {}
            for name in lib["dlopen"]:
                by_stem.setdefault(stem(name), []).append(name)
            for s, names in sorted(by_stem.items()):
                versioned = [n for n in names if n != f"{s}.so"]
                ok = (any(n in provided for n in versioned) if versioned
                      else any(stem(p) == s for p in provided))
                if not ok:
                    problems.append(f"MISSING  {pkg}: {member} loads "
                                    f"{' or '.join(sorted(names))} at run time, which no wheel "
                                    "of the lock and nothing in the base image provides")
    return problems, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lock", type=Path, default=HERE.parent / "requirements-gpu.lock")
    ap.add_argument("--base", type=Path, default=HERE / "base-image-libs.txt")
    ap.add_argument("--optional", type=Path, default=HERE / "gpu-lock-optional.txt")
    ap.add_argument("--cache", type=Path,
                    default=Path.home() / ".cache" / "xling" / "gpu-lock-check")
    ap.add_argument("--jobs", type=int, default=4)
    args = ap.parse_args(argv)

    locked = pins(args.lock)
    with ThreadPoolExecutor(args.jobs * 4) as pool:
        picked = dict(zip(locked, pool.map(lambda nv: pick_wheel(*nv), locked)))
    no_wheel = sorted(f"{n}=={v}" for (n, v), w in picked.items() if w is None)
    todo = {n: w for (n, _), w in picked.items() if w is not None}
    with ThreadPoolExecutor(args.jobs) as pool:
        wheels = dict(zip(todo, pool.map(lambda w: analyse(w, args.cache), todo.values())))
    n_libs = sum(len(w["libs"]) for w in wheels.values())
    problems, skipped = check(wheels, set(entries(args.base)), optional(args.optional))
    print(f"{args.lock.name}: {len(locked)} packages, {len(wheels)} wheels for "
          f"cp311/manylinux_2_35_x86_64, {n_libs} shared libraries "
          f"({sum(bool(w['libs']) for w in wheels.values())} wheels with native code); "
          f"{skipped} optional plug-ins not checked ({args.optional.name})")
    if no_wheel:
        print(f"  no wheel for the platform (sdists, built at install): {', '.join(no_wheel)}")
    for p in problems:
        print(f"  {p}")
    print(f"FAIL: {len(problems)} problems (MISSING: a library nothing provides; CLASH: two "
          "wheels install one file)" if problems else
          "OK: every shared library of the lock finds what it links and the CUDA libraries it "
          "opens")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
