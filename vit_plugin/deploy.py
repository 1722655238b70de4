"""Fast CPU inference with Inductor's weight freezing.

See docs/benchmarks.md#fastest-cpu-inference-compiled-with-frozen-weights."""
from typing import Any

import torch
import torch.nn as nn

from vit_plugin.compat import torch as torch_compat


class FrozenInference(nn.Module):
    """An eval-mode model compiled with Inductor freezing, called without autograd; a call raises RuntimeError
    once a parameter or buffer was written to or the model left eval mode."""

    def __init__(self, model: nn.Module, **compile_kwargs):
        super().__init__()
        self.model = model.eval()
        # not registered as a submodule: state_dict() etc. see the model's tensors once, under 'model.'
        object.__setattr__(self, '_compiled', torch.compile(model, **compile_kwargs))
        self._watched = None  # (name, tensor) of every parameter and buffer, from the first (compiling) call
        self._versions = None  # their version counters then
        self.eval()

    def _check_unchanged(self):
        if self._watched is None:  # one module walk; later calls only read the counters
            self._watched = list(self.model.named_parameters()) + list(self.model.named_buffers())
            self._versions = [torch_compat.version_counter(t) for _, t in self._watched]
            return
        versions = [torch_compat.version_counter(t) for _, t in self._watched]
        if versions != self._versions:
            changed = sorted(name for (name, _), now, then in zip(self._watched, versions, self._versions)
                             if now != then)
            raise RuntimeError(
                f'FrozenInference: {len(changed)} weight(s) were written after compilation (first: {changed[0]}), e.g. '
                'by load_state_dict or an optimizer step. The frozen graph holds a copy of the weights taken '
                'when it compiled and would ignore the change. Call torch.compiler.reset() and wrap the model '
                'again.')

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.model.training:
            raise RuntimeError('FrozenInference runs eval-mode graphs only; the wrapped model was switched to '
                               'train mode. Call model.eval(), or train the plain model.')
        self._check_unchanged()
        with torch.no_grad(), torch_compat.inductor_freezing():
            return self._compiled(*args, **kwargs)


def compile_for_inference(model: nn.Module, **compile_kwargs) -> FrozenInference:
    """``torch.compile`` ``model`` (``compile_kwargs`` passed on) with frozen weights -> :class:`FrozenInference`."""
    return FrozenInference(model, **compile_kwargs)
