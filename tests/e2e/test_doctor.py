"""`xling doctor` on this CPU machine, as CI runs it: every engine reports its version,
devices and native libraries, and runs one record; asked for CUDA here, the GPU engines fail
with their fixes and the exit status says so."""

import re
import subprocess
import sys

from helpers import ROOT


def doctor(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xling.cli", "doctor", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


def sections(out: str) -> dict[str, str]:
    """engine -> its status mark and lines."""
    parts = re.split(r"^(?=\[(?:ok  |warn|skip|FAIL)\] )", out, flags=re.M)
    return {re.match(r"\[.{4}\] (\S+)", p).group(1): p for p in parts if p.startswith("[")}


def test_doctor_on_the_cpu():
    p = doctor("--device", "cpu")
    assert p.returncode == 0, p.stdout + p.stderr
    by = sections(p.stdout)
    assert list(by) == ["torch", "vllm", "ctranslate2", "faiss", "flagembedding", "jvm", "thai"]
    for name in ("torch", "vllm", "ctranslate2", "faiss", "flagembedding", "jvm"):
        assert by[name].startswith("[ok  ]"), by[name]
        assert "devices: " in by[name] and "smoke:   " in by[name], by[name]
    assert "sum 3920 as expected" in by["torch"]
    assert "tiny:llama_chat, 1 prompt -> " in by["vllm"]
    assert re.search(r"tiny:nllb_ct2 on cpu \(\w+\), 1 sentence -> \d+ tokens", by["ctranslate2"])
    assert "a vector finds itself" in by["faiss"]
    assert re.search(r"tiny:bge_m3 on cpu, 1 text -> \d+-d vector", by["flagembedding"])
    assert re.search(r"Java \d+.*Lucene \d+\.\d+", by["jvm"])
    # the libraries each engine loaded, its own first
    assert "ctranslate2.libs/libctranslate2-" in by["ctranslate2"]
    assert "faiss/libfaiss.so" in by["faiss"] and "torch/lib/libtorch" in by["torch"]
    assert "lib/server/libjvm.so" in by["jvm"]
    # Thai: ok on a JVM with a Thai dictionary, else a warning with its fix (not a failure)
    assert by["thai"].startswith(("[ok  ]", "[warn]")), by["thai"]
    if by["thai"].startswith("[warn]"):
        assert "fix:     set JAVA_HOME to a full JDK 21 or later" in by["thai"]
    assert p.stdout.rstrip().endswith("xling doctor (device cpu): every engine works")


def test_doctor_asked_for_cuda_without_a_gpu_fails_with_the_fixes():
    p = doctor("--device", "cuda", "--only", "torch,ctranslate2,faiss")
    assert p.returncode == 1, p.stdout + p.stderr
    by = sections(p.stdout)
    assert by["torch"].startswith("[FAIL]") and "sees no CUDA device" in by["torch"]
    assert "fix:     a CPU build needs `make setup GPU=1`" in by["torch"]
    assert by["ctranslate2"].startswith("[FAIL]")
    assert "CTranslate2 4.8.5 was asked for device cuda but finds no CUDA device" in \
        by["ctranslate2"]
    assert "fix:     run it where a GPU is" in by["ctranslate2"]
    assert by["faiss"].startswith("[ok  ]")  # searched on the CPU whatever the device
    assert "FAILED: torch, ctranslate2" in p.stdout
    bad = doctor("--only", "torch,cuda")
    assert bad.returncode == 2 and "unknown engine cuda" in bad.stderr
