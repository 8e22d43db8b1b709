"""Build and call ``_cpu_kernels.c``: fused dropout and attention-with-dropout for CPU training.

The C file is compiled on first use with the machine's C compiler (``cc -O3 -march=native
-fopenmp``, about a second) into ``$XDG_CACHE_HOME/archhpo`` (default ``~/.cache/archhpo``), keyed
by the source, the compiler flags and the CPU, and loaded with ctypes: the same way torch.compile's
CPU backend builds its kernels, without its compile time.  Where no compiler works, ``lib()`` is
None and ``archhpo.models._dropout`` computes the same masks with tensor operations (slower).
``ARCHHPO_CPU_KERNELS=0`` forces that path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path

_SOURCE = Path(__file__).with_name("_cpu_kernels.c")
_FLAGS = ["-O3", "-march=native", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC", "-std=gnu11"]
_CPU_FLAGS_FILE = Path("/proc/cpuinfo")


class View(ctypes.Structure):
    """Mirror of ``view``: a (B, H, L, D) float32 tensor with unit stride along D, by its strides."""

    _fields_ = [("p", ctypes.c_void_p), ("sb", ctypes.c_int64), ("sh", ctypes.c_int64), ("sl", ctypes.c_int64)]


class AttnArgs(ctypes.Structure):
    """Mirror of ``attn_args`` in the C file (same field order and types)."""

    _fields_ = [
        ("B", ctypes.c_int64), ("H", ctypes.c_int64), ("L", ctypes.c_int64), ("D", ctypes.c_int64),
        ("msb", ctypes.c_int64), ("msh", ctypes.c_int64), ("msi", ctypes.c_int64),
        ("mask", ctypes.c_void_p),
        ("scale", ctypes.c_float),
        ("s0", ctypes.c_uint32), ("s1", ctypes.c_uint32), ("thr", ctypes.c_uint32),
        ("dscale", ctypes.c_float),
    ]  # fmt: skip


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "archhpo"


def _machine_key() -> str:
    # -march=native: a library built on one CPU may not run on another sharing the cache (NFS home).
    cpu = ""
    if _CPU_FLAGS_FILE.exists():
        lines = _CPU_FLAGS_FILE.read_text(errors="replace").splitlines()
        cpu = next((ln for ln in lines if ln.startswith("flags")), "")
    parts = [_SOURCE.read_text(), " ".join(_FLAGS), platform.machine(), cpu]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _build(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        cmd = [os.environ.get("CC", "cc"), *_FLAGS, str(_SOURCE), "-o", tmp, "-lm"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        os.replace(tmp, target)  # atomic: workers building at once all load a whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _declare(so: ctypes.CDLL) -> ctypes.CDLL:
    p, i64, u32, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint32, ctypes.c_float, ctypes.c_int
    so.dropout_apply.argtypes = [p, p, i64, u32, u32, u32, f32, i32]
    so.attn_dropout_fwd.argtypes = [View, View, View, View, p, AttnArgs, i32]
    so.attn_dropout_bwd.argtypes = [View, View, View, View, View, p, View, View, View, AttnArgs, i32]
    so.dropout_apply.restype = None
    so.attn_dropout_fwd.restype = so.attn_dropout_bwd.restype = ctypes.c_int  # 1: out of memory
    return so


@functools.cache
def lib() -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot be built (no compiler) or are turned off."""
    if os.environ.get("ARCHHPO_CPU_KERNELS", "1") == "0":
        return None
    target = _cache_dir() / f"cpu_kernels-{_machine_key()}.so"
    try:
        if not target.exists():
            _build(target)
        return _declare(ctypes.CDLL(str(target)))
    except (OSError, subprocess.SubprocessError):
        return None
