"""Lazily-imported access to the torch_xla runtime: importing the package needs no torch_xla."""
import importlib
from typing import Any, List, Optional

import torch

from vit_plugin.compat import torch_xla as torch_xla_compat
from vit_plugin.compat.torch import pytree

_INSTALL_HINT = ('The XLA path needs torch_xla, which only the classic stack has (torch 2.9): '
                 '`STACK=classic make setup` and .venv-classic/bin/python, or pip install "torch==2.9.0" '
                 '"torch-xla[tpu]==2.9.0"; then PJRT_DEVICE=TPU (or CPU).')


def require(module: str = 'torch_xla'):
    """Import the torch_xla (sub)module ``module``, or raise ImportError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f'Cannot import {module!r}: {err}. {_INSTALL_HINT}') from err


def device() -> torch.device:
    """The XLA device of this process (initialises the PJRT runtime on first use)."""
    return require().device()


def world_size() -> int:
    """Number of XLA replicas taking part in training (1 on a CPU host)."""
    return require('torch_xla.runtime').world_size()


def global_ordinal() -> int:
    """Global index of this process's replica."""
    return require('torch_xla.runtime').global_ordinal()


def is_master() -> bool:
    """Whether this process is the global master (ordinal 0), the one that writes checkpoints."""
    return global_ordinal() == 0


def sync() -> None:
    """Cut the lazy graph here and launch it (one call per training iteration)."""
    require().sync()


def is_xla_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == 'xla'


def to_cpu(data: Any) -> Any:
    """``data`` (a tensor or nested dicts, lists, tuples) with every XLA tensor copied to the host in one transfer."""
    leaves, spec = pytree.tree_flatten(data)
    index = [i for i, leaf in enumerate(leaves) if is_xla_tensor(leaf)]
    if not index:
        return data
    require()
    # Pending computations run first; a no-op for tensors the last sync already produced.
    for i, cpu in zip(index, torch_xla_compat.sync_and_copy_to_cpu([leaves[i] for i in index])):
        leaves[i] = cpu
    return pytree.tree_unflatten(leaves, spec)


class CompileCounter:
    """Reads torch_xla's metrics: graphs compiled and launched so far, and time spent compiling."""

    def __init__(self):
        self._met = require('torch_xla.debug.metrics')

    def _counter(self, name: str) -> int:
        return self._met.counter_value(name) or 0

    @property
    def compiles(self) -> int:
        """Graphs compiled so far in this process (compilation-cache hits excluded)."""
        return self._counter('UncachedCompile')

    @property
    def executions(self) -> int:
        """Graphs launched so far (compilation-cache lookups: exact when read)."""
        return self._counter('UncachedCompile') + self._counter('CachedCompile')

    @property
    def compile_seconds(self) -> float:
        """Total time spent compiling graphs so far, in seconds."""
        data = self._met.metric_data('CompileTime')
        return 0.0 if data is None else data[1] / 1e9

    def fallback_ops(self) -> List[str]:
        """aten ops that ran on the host because XLA has no lowering for them (often dynamic)."""
        return sorted(self._met.executed_fallback_ops())


def input_shapes(data: Any) -> Optional[tuple]:
    """Shapes of the tensors of a (nested) batch, in a comparable form, to spot dynamic shapes."""
    leaves = pytree.tree_leaves(data)
    shapes = tuple(tuple(leaf.shape) for leaf in leaves if isinstance(leaf, torch.Tensor))
    return shapes or None
