"""Counter-based random numbers in elementwise torch operations: Philox4x32-10 (Salmon, Moraes, Dror & Shaw 2011,
"Parallel random numbers: as easy as 1, 2, 3"), the generator torch itself uses on CUDA devices.

Why: torch's CPU generator (a Mersenne twister) fills a tensor on one thread, in sequence: one ``torch.randn`` per
weight of the MNIST MLP's 478,410 weights took ~1.6 ms of a ~9 ms compiled training step on two cores (issue 29's
floor rows time exactly this draw). Philox is a pure function of a 64-bit key and a 128-bit counter, written here in
integer torch operations, so :func:`torch.compile` turns a draw into one vectorised loop that every thread of the step
shares (``benchmarks/results/step-time/studies/philox_draw.md``).

``fit(compile=True)`` uses it on the CPU (:func:`counter_draws`): one key per step drawn from torch's generator (so
:func:`torch.manual_seed` makes a run reproducible), and one stream (the counter's upper 64 bits) per draw site, in
the order of the step's calls. The numbers differ from eager's ``torch.randn`` stream; they are equal in
distribution (tests: the published known-answer vector, an integer reference of the algorithm, and Kolmogorov-Smirnov
and moment tests of the normals).

Integers: each 32-bit word is held in an ``int64`` tensor; the 32 x 32-bit products are formed from 16-bit halves so
that no operation overflows (signed overflow is undefined in the C++ that both eager torch and inductor run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

__all__ = [
    "philox4x32",
    "key_schedule",
    "standard_normal",
    "uniform",
    "new_key",
    "counter_draws",
    "begin_counter_draws",
    "end_counter_draws",
    "randn",
    "rand",
]

_MASK = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32's multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # its Weyl key increments (golden ratio, sqrt(3) - 1)
ROUNDS = 10
"""Philox4x32-10: the rounds Salmon et al. recommend (7 already pass BigCrush; 10 is their safety margin)."""


Word = int | torch.Tensor
"""A 32-bit word: an int64 tensor of values in ``[0, 2^32)``, or a Python int there (a word that is the same for every
counter, which costs no tensor operation until it meets one)."""


def _mulhilo(c: Word, m: int) -> tuple[Word, Word]:
    """High and low 32 bits of ``c * m`` for ``0 <= c, m < 2^32``, without a product above 2^48."""
    a = c * (m & 0xFFFF)
    b = c * (m >> 16)
    s = a + ((b & 0xFFFF) << 16)
    return (b >> 16) + (s >> 32), s & _MASK


def key_schedule(k0: Word, k1: Word, rounds: int = ROUNDS) -> list[tuple[Word, Word]]:
    """Philox4x32's round keys ``(k0 + r W0, k1 + r W1) mod 2^32`` for ``r < rounds``: the same for every counter of
    a key, so :func:`counter_draws` computes them once per block for all its draws."""
    keys = [(k0, k1)]
    for _ in range(1, rounds):
        a, b = keys[-1]
        keys.append(((a + _W0) & _MASK, (b + _W1) & _MASK))
    return keys


def philox4x32(
    counter: Sequence[Word], key: Sequence[Word], rounds: int = ROUNDS, *, schedule: Sequence[tuple[Word, Word]] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Philox4x32 bijection: four 32-bit words of ``counter`` (int64 tensors, broadcastable, values in
    ``[0, 2^32)``; a word the same for every counter may be a Python int) under the two words of ``key`` to four
    words. ``rounds`` (default 10); ``schedule``: the key's round keys from :func:`key_schedule`, when already known."""
    if len(counter) != 4 or len(key) != 2:
        raise ValueError(f"philox4x32 takes 4 counter words and 2 key words, got {len(counter)} and {len(key)}")
    for w in (*counter, *key):
        if isinstance(w, torch.Tensor) and w.dtype != torch.int64 or not isinstance(w, (int, torch.Tensor)):
            raise ValueError("philox4x32's counter and key words must be int64 tensors holding values in [0, 2^32)")
        if isinstance(w, int) and not 0 <= w <= _MASK:
            raise ValueError(f"philox4x32's words must be in [0, 2^32), got {w}")
    if schedule is None:
        schedule = key_schedule(key[0], key[1], rounds)
    elif len(schedule) < rounds:
        raise ValueError(f"schedule holds {len(schedule)} round keys, fewer than rounds={rounds}")
    c0, c1, c2, c3 = counter
    for r in range(rounds):
        k0, k1 = schedule[r]
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    words = (c0, c1, c2, c3)
    tensors = [w for w in (*counter, *key) if isinstance(w, torch.Tensor)]
    if not tensors:
        raise ValueError("philox4x32 needs at least one counter or key word as a tensor")
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    if all(isinstance(w, torch.Tensor) and w.shape == shape for w in words):
        return words  # type: ignore[return-value]
    like = tensors[0]  # few rounds, or words no tensor reached: give every word the counters' shape
    return tuple(torch.as_tensor(w, dtype=torch.int64, device=like.device).expand(shape).clone() for w in words)  # type: ignore[return-value]


def _key_words(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if key.dtype != torch.int64 or key.dim() != 0:
        raise ValueError(f"key must be a 0-d int64 tensor (see new_key), got dtype {key.dtype} and shape {tuple(key.shape)}")
    return key & _MASK, (key >> 32) & _MASK


def _blocks(
    numel: int, key: torch.Tensor, stream: int, schedule: Sequence[tuple[Word, Word]] | None = None
) -> tuple[torch.Tensor, ...]:
    """Four words for each of ``ceil(numel / 4)`` consecutive counters of ``stream`` (the counter's upper three words
    are the same for all of them: Python ints, so that Philox's first round spends no tensor operation on them)."""
    if not 0 <= stream < 2**64:
        raise ValueError(f"stream must be an integer in [0, 2^64), got {stream}")
    m = (numel + 3) // 4
    j = torch.arange(m, dtype=torch.int64, device=key.device)
    low, high = (j & _MASK, j >> 32) if m > 2**32 else (j, 0)
    if schedule is None:
        schedule = key_schedule(*_key_words(key))
    return philox4x32((low, high, stream & _MASK, stream >> 32), schedule[0], schedule=schedule)


def _shape(shape: Sequence[int] | torch.Size) -> tuple[int, torch.Size]:
    size = torch.Size(shape)
    if any(s < 0 for s in size):
        raise ValueError(f"shape must have sizes >= 0, got {tuple(size)}")
    return math.prod(size), size


def _floats(dtype: torch.dtype) -> torch.dtype:
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    return torch.float64 if dtype == torch.float64 else torch.float32


def standard_normal(
    shape: Sequence[int] | torch.Size,
    key: torch.Tensor,
    stream: int = 0,
    dtype: torch.dtype = torch.float32,
    *,
    schedule: Sequence[tuple[Word, Word]] | None = None,
) -> torch.Tensor:
    """``N(0, 1)`` numbers of ``shape`` from Philox's words for ``key`` (a 0-d int64 tensor, on the device to draw on)
    and ``stream``, by the Box-Muller transform: each counter's four words give two radii ``sqrt(-2 log u)`` with
    ``u = (w + 1) / 2^32`` in ``(0, 1]`` (so the largest |z| is ``sqrt(64 ln 2)`` = 6.66) and two
    angles ``2 pi w / 2^32``; four normals per counter, in counter order. Computed in float32 (float64 for float64).
    ``schedule``: ``key``'s round keys (:func:`key_schedule` of its two words), when already computed."""
    numel, size = _shape(shape)
    work = _floats(dtype)
    w0, w1, w2, w3 = _blocks(numel, key, stream, schedule)
    inv = 2.0**-32
    r0 = torch.sqrt(-2.0 * torch.log((w0 + 1).to(work) * inv))
    r1 = torch.sqrt(-2.0 * torch.log((w2 + 1).to(work) * inv))
    t0 = w1.to(work) * (2 * math.pi * inv)
    t1 = w3.to(work) * (2 * math.pi * inv)
    z = torch.stack([r0 * torch.cos(t0), r0 * torch.sin(t0), r1 * torch.cos(t1), r1 * torch.sin(t1)], dim=-1)
    return z.reshape(-1)[:numel].reshape(size).to(dtype)


def uniform(
    shape: Sequence[int] | torch.Size,
    key: torch.Tensor,
    stream: int = 0,
    dtype: torch.dtype = torch.float32,
    *,
    schedule: Sequence[tuple[Word, Word]] | None = None,
) -> torch.Tensor:
    """Uniform numbers in ``[0, 1)`` of ``shape``: each word's upper ``p`` bits over ``2^p``, ``p`` the dtype's
    significand bits (24 for float32, 11 for float16, 8 for bfloat16, so that every value is exact and below 1; 53
    from two words for float64)."""
    numel, size = _shape(shape)
    work = _floats(dtype)
    if work == torch.float64:  # two words per number: 26 + 27 bits
        pairs = torch.stack(_blocks(2 * numel, key, stream, schedule), dim=-1).reshape(-1)[: 2 * numel].reshape(-1, 2)
        u = (((pairs[:, 0] >> 6) << 27) | (pairs[:, 1] >> 5)).to(work) * 2.0**-53
    else:
        bits = 1 - round(math.log2(torch.finfo(dtype).eps))  # significand bits: float32 24, float16 11, bfloat16 8
        u = (torch.stack(_blocks(numel, key, stream, schedule), dim=-1) >> (32 - bits)).to(work) * 2.0**-bits
    return u.reshape(-1)[:numel].reshape(size).to(dtype)


def new_key(device: torch.device | str | None = None) -> torch.Tensor:
    """A key (0-d int64 tensor in ``[0, 2^63)``) drawn from torch's generator of ``device`` (default the CPU's)."""
    return torch.randint(0, 2**63 - 1, (), dtype=torch.int64, device=device)


class _Draws:
    def __init__(self, key: torch.Tensor) -> None:
        self.key = key
        self.stream = 0
        self.schedule: list[tuple[Word, Word]] | None = None  # the key's round keys, once for all the block's draws

    def next_stream(self) -> int:
        self.stream += 1
        return self.stream - 1

    def round_keys(self) -> list[tuple[Word, Word]]:
        if self.schedule is None:
            self.schedule = key_schedule(*_key_words(self.key))
        return self.schedule


_active: _Draws | None = None


def begin_counter_draws(key: torch.Tensor) -> None:
    """Start :func:`counter_draws`'s block without a ``with`` (what a traced function can call); end it with
    :func:`end_counter_draws`."""
    global _active
    _key_words(key)
    if _active is not None:
        raise RuntimeError("counter_draws is already active: they do not nest")
    _active = _Draws(key)


def end_counter_draws() -> None:
    """End the block :func:`begin_counter_draws` started."""
    global _active
    _active = None


@contextmanager
def counter_draws(key: torch.Tensor) -> Iterator[None]:
    """Within the block, :func:`randn` and :func:`rand` (the families' weight noise) draw from Philox with ``key``,
    stream 0, 1, 2, ... in call order, instead of from torch's generator. Blocks do not nest."""
    begin_counter_draws(key)
    try:
        yield
    finally:
        end_counter_draws()


def _draw(
    shape: Sequence[int] | torch.Size,
    dtype: torch.dtype,
    device: torch.device,
    counter: Callable[..., torch.Tensor],
    plain: Callable[..., torch.Tensor],
) -> torch.Tensor:
    draws = _active
    if draws is None or draws.key.device != device:
        return plain(shape, dtype=dtype, device=device)
    return counter(shape, draws.key, draws.next_stream(), dtype, schedule=draws.round_keys())


def randn(shape: Sequence[int] | torch.Size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.randn(shape, dtype=dtype, device=device)``, or the next stream's :func:`standard_normal` inside
    :func:`counter_draws` (for a key on ``device``)."""
    return _draw(shape, dtype, device, standard_normal, torch.randn)


def rand(shape: Sequence[int] | torch.Size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.rand(shape, dtype=dtype, device=device)``, or the next stream's :func:`uniform` inside
    :func:`counter_draws` (for a key on ``device``)."""
    return _draw(shape, dtype, device, uniform, torch.rand)
