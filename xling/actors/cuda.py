"""CUDA for the engines that do not bring their own: where CTranslate2 finds cuBLAS, and
whether this process may use a GPU at all.

torch 2.13 and vLLM are CUDA 13 builds (requirements-gpu.lock: nvidia-cublas 13, under
site-packages/nvidia/cu13/lib). CTranslate2 4.8.5's only Linux wheel is a CUDA 12 build: its
library links the CUDA runtime statically but opens `libcublas.so.12` by name (dlopen) on
first GPU use, which nothing on its search path provides. The lock therefore also pins
nvidia-cublas-cu12 (site-packages/nvidia/cublas/lib) and the NVRTC 12 its cuBLASLt opens
(nvidia-cuda-nvrtc-cu12, nvidia/cuda_nvrtc/lib), and `preload_cublas12` loads them into the
process by path with RTLD_GLOBAL before a CUDA translator starts, so CTranslate2's dlopen
finds it loaded. The two cuBLAS versions have different sonames and live side by side.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

# (soname, its wheel's folder under site-packages/nvidia), in load order: cuBLASLt opens
# NVRTC by name for the kernels it compiles at run time, and libcublas links cuBLASLt.
CUBLAS12 = (("libnvrtc.so.12", "cuda_nvrtc"), ("libcublasLt.so.12", "cublas"),
            ("libcublas.so.12", "cublas"))
CUBLAS12_FIX = ("install CUDA 12 cuBLAS beside torch's CUDA 13 (pip install "
                "nvidia-cublas-cu12==12.9.1.4 nvidia-cuda-nvrtc-cu12==12.9.86; "
                "requirements-gpu.lock pins them, `make setup GPU=1`)")


def _wheel_lib(name: str, folder: str) -> Path | None:
    for entry in sys.path:
        path = Path(entry or ".", "nvidia", folder, "lib", name)
        if path.is_file():
            return path
    return None


def preload_cublas12() -> list[str]:
    """Load CUDA 12 cuBLAS (and NVRTC) into this process (the nvidia-*-cu12 wheels', else
    the system's); the paths loaded. Raises RuntimeError with the fix when it is nowhere."""
    loaded = []
    for name, folder in CUBLAS12:
        path = _wheel_lib(name, folder)
        try:
            ctypes.CDLL(str(path) if path else name, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise RuntimeError(f"CTranslate2 on CUDA opens {name}, which cannot be loaded "
                               f"({e}); {CUBLAS12_FIX}") from None
        loaded.append(str(path) if path else name)
    return loaded


def ray_gpus() -> list:
    """The GPUs Ray gave this actor or task ([] when none, or outside Ray)."""
    try:
        import ray

        return list(ray.get_gpu_ids()) if ray.is_initialized() else []
    except Exception:  # noqa: BLE001 - no Ray here: nothing was given
        return []


def no_cuda_device(engine: str, why: str) -> str:
    """The error of an engine asked for CUDA that finds no device, with the fixes."""
    return (f"{engine} was asked for device cuda but finds no CUDA device ({why}). Fix: run "
            "it where a GPU is (translate.parallel.num_gpus >= 1 on a cluster with GPUs), "
            "check the driver (nvidia-smi), run `xling doctor --device cuda`; or set "
            "translate.device: cpu")
