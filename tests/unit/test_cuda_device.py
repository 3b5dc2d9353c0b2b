"""A translator asked for CUDA that has no CUDA device stops before any work, with the fix:
at config validation when no GPU is reserved for it, when its pool starts on a cluster
without GPUs, and in the actor when CTranslate2 sees no device. Never a CPU fallback.
(This machine has no GPU: these are the real failures a user would meet.)"""

import textwrap
from pathlib import Path

import pytest

from xling.actors.translator import Translator, cuda_or_cpu
from xling.config import load_config
from xling.core.config import ConfigError, Parallelism

ROOT = Path(__file__).resolve().parents[2]
CONFIG = f"""
name: t
stages: [translate]
translate:
  model: tiny:nllb_ct2
  device: cuda
  documents:
    - name: m
      format: mrtydi
      path: {ROOT}/data/demo/mrtydi/{{lang}}.jsonl.gz
      langs: [fi]
      targets: [en]
"""


def test_cuda_without_a_reserved_gpu_is_a_config_error(tmp_path):
    (tmp_path / "c.yaml").write_text(textwrap.dedent(CONFIG))
    with pytest.raises(ConfigError, match=r"device: cuda needs a GPU per translator actor: set "
                                          r"translate.parallel.num_gpus"):
        load_config(tmp_path / "c.yaml")
    cfg = load_config(tmp_path / "c.yaml", ["translate.parallel.num_gpus=1"])
    assert cfg.translate.device == "cuda"


def test_a_gpu_pool_on_a_cluster_without_gpus_fails_before_starting(monkeypatch):
    import ray

    from xling.core.pools import actor_pool

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    with pytest.raises(ConfigError, match=r"translate.parallel.num_gpus=1 but the Ray cluster "
                                          r"has 0 GPUs"):
        actor_pool(Parallelism(num_gpus=1.0), key="translate.parallel")


def test_the_translator_refuses_cuda_without_a_device(tmp_path):
    import ctranslate2

    assert ctranslate2.get_cuda_device_count() == 0  # a machine without a GPU
    with pytest.raises(RuntimeError) as e:
        Translator(str(tmp_path), "m", [("fi", "fin_Latn", "en", "eng_Latn")], device="cuda")
    assert "asked for device cuda but finds no CUDA device" in str(e.value)
    assert "translate.device: cpu" in str(e.value)
    # auto is the CPU only where Ray gave the actor no GPU
    assert cuda_or_cpu("auto") == "cpu"
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as m:
        m.setattr("xling.actors.cuda.ray_gpus", lambda: [0])
        with pytest.raises(RuntimeError, match=r"Ray gave this actor GPU \[0\]"):
            cuda_or_cpu("auto")


def test_cublas12_is_loaded_from_the_wheels_by_path_or_refused_with_the_fix(tmp_path, monkeypatch):
    """CTranslate2's CUDA 12 cuBLAS comes from the nvidia-*-cu12 wheels' folders on sys.path
    (stood in for by copies of zlib: what is tested is where they are looked up and the
    order they load in); without them, the error names the packages to install."""
    import shutil
    import sys

    from xling.actors.cuda import CUBLAS12, preload_cublas12

    import ctypes.util

    monkeypatch.setattr(sys, "path", [str(tmp_path / "empty"), *sys.path])
    if ctypes.util.find_library("nvrtc") is None:  # no system CUDA 12 to fall back on
        with pytest.raises(RuntimeError, match=r"CTranslate2 on CUDA opens libnvrtc.so.12, "
                                               r"which cannot be loaded .*pip install "
                                               r"nvidia-cublas-cu12"):
            preload_cublas12()
    for name, folder in CUBLAS12:
        (tmp_path / "sp" / "nvidia" / folder / "lib").mkdir(parents=True, exist_ok=True)
        shutil.copy("/lib/x86_64-linux-gnu/libz.so.1", tmp_path / "sp" / "nvidia" / folder /
                    "lib" / name)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "sp"), *sys.path])
    assert preload_cublas12() == [str(tmp_path / "sp/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"),
                                  str(tmp_path / "sp/nvidia/cublas/lib/libcublasLt.so.12"),
                                  str(tmp_path / "sp/nvidia/cublas/lib/libcublas.so.12")]
