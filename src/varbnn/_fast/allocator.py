"""glibc allocator settings for CPU training (:func:`keep_freed_memory`): a process-wide speed setting, opt-in."""

from __future__ import annotations

import sys

from varbnn._checks import as_int

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's largest M_MMAP_THRESHOLD on 64-bit systems


def keep_freed_memory(trim_threshold: int = 1 << 30, mmap_threshold: int = _MMAP_THRESHOLD_MAX) -> bool:
    """Ask glibc's allocator (Linux) to keep the memory a training step frees for the next step, instead of returning
    the top of its heap to the system after each step and faulting it back in, page by page, on the next: a process-wide
    setting, for CPU training, made once before training (it does not affect GPU memory).

    A Bayesian step allocates and frees tensors of its weights' size every step (noise, draws, gradients), which glibc's
    defaults return to the system and fault back in, page by page. In interleaved A/B runs
    (``benchmarks/ab_step.py``, ``benchmarks/results/step-time/studies/ab_*_glibc_keep_heap.md``) the setting made compiled
    MeanField reparam steps 12% faster, eager ones 7%, compiled RadialDirectional (double grouping) 18%, torchbnn's
    5%, and left the plain network's step unchanged. The process keeps up to ``trim_threshold`` bytes of freed heap
    that it would otherwise give back (its resident memory stays at its peak), and tensors up to ``mmap_threshold``
    bytes come from the heap rather than from their own mappings. The same from the shell, without code:
    ``MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_MMAP_THRESHOLD_=33554432 python train.py``.

    :param trim_threshold: bytes of free memory at the heap's top that glibc keeps (default 1 GiB), an int >= 0.
    :param mmap_threshold: allocations of at least this many bytes get their own mapping (default 32 MiB, glibc's
        largest), an int in ``[0, 32 MiB]``.
    :returns: ``True`` when glibc took both settings, ``False`` where there is no glibc (macOS, Windows, musl):
        nothing changes there.
    """
    trim_threshold = as_int(trim_threshold, "trim_threshold", low=0, owner="keep_freed_memory")
    mmap_threshold = as_int(mmap_threshold, "mmap_threshold", low=0, high=_MMAP_THRESHOLD_MAX, owner="keep_freed_memory")
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no C library with mallopt (e.g. musl)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1))) and bool(
        mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
    )
