"""cluster/check_gpu_lock.py's reading and rules, offline: the ELF dynamic section and the
run-time CUDA names of a real library (the CTranslate2 4.8.5 wheel installed here is the one
the GPU lock pins: the same libctranslate2), then the rules on those findings. `make
check-gpu-lock` runs it over the whole lock from PyPI."""

import importlib.util
import re
from pathlib import Path

import ctranslate2

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_gpu_lock", ROOT / "cluster/check_gpu_lock.py")
check_gpu_lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_gpu_lock)


def findings(path: Path) -> dict:
    data = path.read_bytes()
    out = check_gpu_lock.elf_dynamic(data)
    out["dlopen"] = sorted({m.decode() for m in check_gpu_lock.CUDA_LIB.findall(data)})
    return out


def test_ctranslate2_links_its_own_libraries_and_opens_cublas_12():
    libs = Path(ctranslate2.__file__).parent.parent / "ctranslate2.libs"
    lib = findings(next(libs.glob("libctranslate2-*.so*")))
    assert re.fullmatch(r"libctranslate2-\w+\.so\.4\.8\.5", lib["soname"])
    assert "libstdc++.so.6" in lib["needed"] and any(n.startswith("libgomp-")
                                                      for n in lib["needed"])
    assert lib["runpath"] == ["$ORIGIN"]
    # cuBLAS 12 by name at first GPU use, the driver, NCCL for tensor parallelism; not MKL's
    # CPU dispatch names, which are in its bytes too
    assert lib["dlopen"] == ["libcublas.so.12", "libcuda.so.1", "libnccl.so.2"]
    assert check_gpu_lock.elf_dynamic(b"not an ELF file at all") is None


def test_the_rules():
    ct2 = {"libs": {"ctranslate2.libs/libct2.so": {
        "soname": "libct2.so", "needed": ["libc.so.6"], "runpath": [],
        "dlopen": ["libcublas.so.12", "libcuda.so.1"]}}}
    cu13 = {"libs": {"nvidia/cu13/lib/libcublas.so.13": {
        "soname": "libcublas.so.13", "needed": ["libcublasLt.so.13"], "runpath": [],
        "dlopen": ["libnvrtc.so.12", "libnvrtc.so.13"]}}}
    base = {"libc.so.6", "libcuda.so.1"}
    problems, skipped = check_gpu_lock.check({"ctranslate2": ct2, "nvidia-cublas": cu13}, base)
    assert skipped == 0 and problems == [
        "MISSING  ctranslate2: ctranslate2.libs/libct2.so loads libcublas.so.12 at run time, "
        "which no wheel of the lock and nothing in the base image provides",
        "MISSING  nvidia-cublas: nvidia/cu13/lib/libcublas.so.13 links libcublasLt.so.13, "
        "which no wheel of the lock and nothing in the base image provides",
        # libnvrtc in either version would do: one line for both
        "MISSING  nvidia-cublas: nvidia/cu13/lib/libcublas.so.13 loads libnvrtc.so.12 or "
        "libnvrtc.so.13 at run time, which no wheel of the lock and nothing in the base "
        "image provides"]
    cu12 = {"libs": {
        "nvidia/cublas/lib/libcublas.so.12": {"soname": "libcublas.so.12", "needed": [],
                                              "runpath": [], "dlopen": []},
        "nvidia/cu13/lib/libcublas.so.13": {"soname": "libcublas.so.13", "needed": [],
                                            "runpath": [], "dlopen": []}}}
    problems, skipped = check_gpu_lock.check(
        {"ctranslate2": ct2, "nvidia-cublas": cu13, "nvidia-cublas-cu12": cu12}, base,
        [("nvidia-cublas", "nvidia/cu13/lib/libcublas.so.*")])  # an optional plug-in
    # cuBLAS 12 is provided now; the optional library is not checked; one file, two wheels
    assert skipped == 1 and problems == [
        "CLASH    nvidia-cublas-cu12: nvidia/cu13/lib/libcublas.so.13 is also installed by "
        "nvidia-cublas; the one installed last overwrites the other's"]
