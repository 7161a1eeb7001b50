"""Multi-process data-parallel training on torch's own engine (``torch.distributed`` + ``DistributedDataParallel``).

varbnn adds no rendezvous, collectives or fault handling of its own: launch with ``torchrun`` (which sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``), call :func:`setup` once per process, build the
loader with :func:`data_loader` and train with :func:`varbnn.train.fit`, which wraps the model in
``DistributedDataParallel`` whenever a process group of more than one process is initialised.

Why the ELBO stays right: every rank minimises ``mean NLL of its shard + beta * KL / N_train`` and DDP averages the
gradients, so the step follows ``mean NLL over the union batch + beta * KL / N_train`` (equal shard sizes): the KL
is counted exactly once per global step, not once per rank. Each rank draws its own weight noise (its RNG is offset
by its rank), so the averaged gradient also averages ``world_size`` independent Monte Carlo draws.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from varbnn._checks import as_float_in

__all__ = [
    "DistributedContext",
    "setup",
    "teardown",
    "is_distributed",
    "rank",
    "world_size",
    "is_main_process",
    "data_loader",
    "all_reduce_mean_",
    "rank_seed",
    "barrier",
    "equal_share",
    "SETUP_TIMEOUT",
    "SETUP_TIMEOUT_ENV",
]

BACKENDS = ("gloo", "nccl")

SETUP_TIMEOUT = 300.0
"""Seconds :func:`setup` waits for every rank to join (and a rank other than 0 for the rendezvous to open) before it
gives up with a ``TimeoutError`` naming the missing ranks; torch's own default would wait 30 minutes in silence."""

SETUP_TIMEOUT_ENV = "VARBNN_DIST_TIMEOUT"
"""The environment variable that sets :func:`setup`'s ``timeout`` when the call gives none (seconds, a positive number);
e.g. ``VARBNN_DIST_TIMEOUT=900 torchrun ... -m varbnn.cli reproduce NAME --distributed``."""


@dataclass(frozen=True)
class DistributedContext:
    """Where this process stands: ``rank`` of ``world_size`` processes, its ``device`` and the ``backend``
    (``None`` when running as a single plain process); what :func:`setup` returns.

    :ivar rank: the process's global rank (0 in a single process).
    :ivar world_size: the number of processes (1 in a single process).
    :ivar local_rank: the rank on this machine (``LOCAL_RANK``), which picks ``cuda:LOCAL_RANK``.
    :ivar device: the device this process trains on.
    :ivar backend: ``"gloo"``, ``"nccl"`` or ``None``.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the process that writes checkpoints and results."""
        return self.rank == 0


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def _setup_timeout(timeout: float | None) -> float:
    """``timeout``, else ``$VARBNN_DIST_TIMEOUT``, else :data:`SETUP_TIMEOUT`: checked to be a positive finite number."""
    where = "timeout"
    if timeout is None and os.environ.get(SETUP_TIMEOUT_ENV):
        where, text = f"environment variable {SETUP_TIMEOUT_ENV}", os.environ[SETUP_TIMEOUT_ENV]
        try:
            timeout = float(text)
        except ValueError:
            raise ValueError(f"{where} must be a positive number of seconds, got {text!r}") from None
    if timeout is None:
        return SETUP_TIMEOUT
    return as_float_in(timeout, f"{where} (seconds)", 0.0, None, low_open=True)


def _rendezvous(rank: int, world: int, seconds: float) -> dist.Store:
    """The store every rank meets at (``MASTER_ADDR:MASTER_PORT``, as torch's ``env://`` opens it: served by rank 0, or
    by torchrun's agent when it says so), after every rank has checked in; a rank missing after ``seconds`` is a
    ``TimeoutError`` naming the missing ranks, the world size and the address."""
    addr, port = os.environ.get("MASTER_ADDR"), _env_int("MASTER_PORT")
    if not addr or port is None:
        raise ValueError(
            "RANK and WORLD_SIZE are set but MASTER_ADDR / MASTER_PORT are not: launch with torchrun, which sets all four"
        )
    where = f"MASTER_ADDR:MASTER_PORT = {addr}:{port}"
    raise_it = f"(set {SETUP_TIMEOUT_ENV} or setup(timeout=...) to wait longer)"
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's agent serves the store
    serves = rank == 0 and not agent
    try:
        store = dist.TCPStore(addr, port, world_size=world, is_master=serves, timeout=timedelta(seconds=seconds),
                              wait_for_workers=False, multi_tenant=True)  # fmt: skip
    except Exception as error:  # noqa: BLE001 -- torch raises DistNetworkError, DistStoreError, RuntimeError, ...
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if serves:
            raise RuntimeError(f"rank 0 of world size {world} could not open the rendezvous at {where}: {reason}") from None
        raise TimeoutError(
            f"rank {rank} of world size {world} could not reach the rendezvous at {where} within {seconds:g} s "
            f"{raise_it}: is rank 0{' (torchrun)' if agent else ''} running, at that address? ({reason})"
        ) from None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    keys = [f"varbnn/setup/{attempt}/rank{r}" for r in range(world)]
    store.set(keys[rank], "joined")
    try:
        store.wait(keys, timedelta(seconds=seconds))
    except Exception:  # noqa: BLE001 -- a timeout (DistStoreError), or the store gone with rank 0
        try:
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            missing_text = f"ranks {missing} did not join"
        except Exception:  # noqa: BLE001 -- the store is gone: rank 0 (its server) ended
            missing_text = "the rendezvous closed (rank 0 ended?)"
        raise TimeoutError(
            f"distributed setup timed out after {seconds:g} s on rank {rank} of world size {world} at {where}: "
            f"{missing_text} {raise_it}; start every rank (torchrun --nproc_per_node {world}) or lower WORLD_SIZE"
        ) from None
    from torch.distributed.constants import default_pg_timeout

    store.set_timeout(default_pg_timeout)  # the collectives' own timeout from here on
    return store


def setup(
    backend: str | None = None, device: str | torch.device | None = None, timeout: float | None = None
) -> DistributedContext:
    """Initialise the default process group from torchrun's environment (``RANK``, ``WORLD_SIZE``, ...).

    ``backend``: ``"gloo"`` (CPU) or ``"nccl"`` (GPU); default nccl when ``device`` is CUDA, else gloo.
    ``device``: ``"cpu"``, ``"cuda"`` (then ``cuda:LOCAL_RANK``) or ``None`` (cuda if available). Without
    torchrun's variables this returns a single-process context and initialises nothing, so the same script runs
    with and without ``torchrun``. Calling it again after initialisation returns the current context.

    ``timeout``: seconds to wait for every rank to join at ``MASTER_ADDR:MASTER_PORT`` (``None``: the environment
    variable ``VARBNN_DIST_TIMEOUT``, else :data:`SETUP_TIMEOUT`, 300 s). A rank still missing then is a
    ``TimeoutError`` naming the missing ranks, the world size and the address (torch alone would wait 30 minutes in
    silence); on a rank other than 0, so is a rendezvous that does not open. The collectives keep torch's timeout.
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    if timeout is not None:  # a bad argument is refused in one process too; the environment is read for a rendezvous
        _setup_timeout(timeout)
    local_rank = _env_int("LOCAL_RANK") or 0
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was requested but torch.cuda.is_available() is False")
        if dev.index is None:
            dev = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(dev)
    env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if dist.is_available() and dist.is_initialized():
        return DistributedContext(dist.get_rank(), dist.get_world_size(), local_rank, dev, dist.get_backend())
    if env_rank is None or env_world is None:
        return DistributedContext(0, 1, 0, dev, None)
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build of torch")
    chosen = backend or ("nccl" if dev.type == "cuda" else "gloo")
    if chosen == "nccl" and dev.type != "cuda":
        raise ValueError("backend 'nccl' needs a CUDA device; use backend='gloo' on the CPU")
    if not 0 <= env_rank < env_world:
        raise ValueError(f"environment variable RANK must be in [0, WORLD_SIZE = {env_world}), got {env_rank}")
    store = _rendezvous(env_rank, env_world, _setup_timeout(timeout))
    dist.init_process_group(chosen, store=store, rank=env_rank, world_size=env_world)
    return DistributedContext(env_rank, env_world, local_rank, dev, chosen)


def teardown() -> None:
    """Destroy the default process group if one is initialised (no-op otherwise)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_distributed() -> bool:
    """True when a process group of more than one process is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank in the default process group (0 when none is initialised)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """The number of processes in the default process group (1 when none is initialised)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    """Rank 0 (or a single process): the one that writes checkpoints and results."""
    return rank() == 0


def barrier() -> None:
    """Wait until every rank gets here (no-op in a single process): e.g. before the other ranks read a file rank 0
    wrote."""
    if is_distributed():
        dist.barrier()


def rank_seed(seed: int, process_rank: int | None = None) -> int:
    """The seed of a rank's weight noise: distinct per rank, reproducible, ``seed`` itself on rank 0."""
    r = rank() if process_rank is None else process_rank
    return (int(seed) + 1_000_003 * r) % 2**63


def equal_share(x: torch.Tensor, y: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """This rank's equal share of in-memory ``(x, y)`` (every ``world_size``-th example from its rank, the remainder
    dropped so that every rank runs as many steps) and its per-process batch ``batch_size // world_size`` (the global
    batch unchanged); ``(x, y, batch_size)`` as they are in a single process. For loops that batch tensors themselves
    (:func:`data_loader` is the ``Dataset`` form)."""
    world = world_size()
    if world == 1:
        return x, y, batch_size
    mine = slice(rank(), (x.shape[0] // world) * world, world)
    return x[mine], y[mine], max(1, batch_size // world)


def data_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    **kwargs: object,
) -> DataLoader:
    """A ``DataLoader`` over this rank's shard (``DistributedSampler``) when distributed, a plain one otherwise.

    ``batch_size`` is per process; the global batch is ``batch_size * world_size``. :func:`varbnn.train.fit` calls
    ``sampler.set_epoch(epoch)`` so every epoch is shuffled differently (and identically on every rank)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not is_distributed():
        generator = torch.Generator().manual_seed(seed)
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, generator=generator, **kwargs)  # type: ignore[arg-type]
    sampler: DistributedSampler[int] = DistributedSampler(dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **kwargs)  # type: ignore[arg-type]


def all_reduce_mean_(tensors: list[torch.Tensor]) -> None:
    """Average each tensor over the ranks, in place (no-op in a single process)."""
    if not is_distributed():
        return
    n = dist.get_world_size()
    for t in tensors:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t.div_(n)
