"""Fused forms of the encoder block's dense layers: the same functions in fewer memory passes.

A ViT block is dominated by its four GEMMs; the work around them (adding biases, GELU, residual
additions) is memory-bound and, done as separate ops, each of them reads and writes a (B, N, width)
buffer. On CPUs that costs a few percent of a block (attention's kernel and the GEMMs' own
efficiency cost more; see the README's Speed section), so here

- the residual branches accumulate onto their residual inside the GEMM (:func:`linear_residual`,
  training and inference alike);
- in fp32 CPU inference, the first MLP layer applies its bias and GELU as oneDNN post-ops of the GEMM
  (:func:`linear_gelu`), the way PyTorch's Inductor fuses them.

Every function computes exactly what the unfused layers compute, up to float summation order, and
falls back to the plain ops wherever a fused kernel does not apply (autograd recording, autocast,
other devices and dtypes, builds without oneDNN).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def _onednn_linear_pointwise():
    """oneDNN's fused linear + post-op kernel, or None where this torch build has none."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


_LINEAR_POINTWISE = _onednn_linear_pointwise()


def onednn_fusion_applies(x: torch.Tensor, linear: nn.Linear) -> bool:
    """Whether :func:`linear_gelu` can use the fused oneDNN kernel for ``linear(x)``.

    Only without autograd (the kernel has no backward), on CPU fp32 tensors, outside autocast, and in
    eager mode: under ``torch.compile`` the plain ops are traced and Inductor fuses them itself (its
    lowering of this kernel expects weights it has pre-packed and fails on ours).
    """
    return (_LINEAR_POINTWISE is not None and not torch.is_grad_enabled() and x.device.type == 'cpu'
            and x.dtype == torch.float32 and linear.weight.dtype == torch.float32
            and not torch.is_autocast_enabled('cpu') and not torch.compiler.is_compiling())


def linear_gelu(x: torch.Tensor, linear: nn.Linear, approximate: str = 'none') -> torch.Tensor:
    """``GELU(linear(x))``, with bias and GELU fused into the GEMM in fp32 CPU inference.

    Elsewhere it is the plain ``F.gelu(linear(x))``, with the GELU in place when no autograd graph is
    recorded (which saves a (B, N, hidden) buffer).

    Args:
        x (Tensor): (..., in_features).
        linear (nn.Linear): The dense layer.
        approximate (str): 'none' (exact, erf) or 'tanh'. Defaults to 'none'.
    """
    if onednn_fusion_applies(x, linear):
        return _LINEAR_POINTWISE(x, linear.weight, linear.bias, 'gelu', [], approximate)
    y = linear(x)
    if torch.is_grad_enabled() and y.requires_grad:
        return F.gelu(y, approximate=approximate)
    return torch._C._nn.gelu_(y, approximate=approximate)


def linear_residual(residual: torch.Tensor, x: torch.Tensor, linear: nn.Linear, inplace: bool = False) -> torch.Tensor:
    """``residual + linear(x)`` with the residual as the GEMM's accumulator.

    A plain ``residual + linear(x)`` writes the product into a fresh buffer that first receives the
    broadcast bias, then reads it back for the addition. Here ``residual + bias`` is formed once and
    the GEMM accumulates onto it (``beta=1``): one buffer and one memory pass fewer per residual
    branch, in training and inference alike (autograd handles the in-place GEMM). Only the summation
    order differs, i.e. float rounding.

    Args:
        residual (Tensor): (..., out_features).
        x (Tensor): (..., in_features), same leading shape.
        linear (nn.Linear): The projection.
        inplace (bool): Accumulate into ``residual`` itself (no graph may need it). Defaults to False.
    """
    if torch.is_autocast_enabled(x.device.type) or x.dtype != residual.dtype or torch.compiler.is_compiling():
        # Autocast does not cover in-place GEMMs: keep the plain form (fp32 residual + low-precision branch).
        # Under torch.compile the plain form leaves the pattern matching to Inductor: an addmm_ kept the
        # frozen graph (vit_plugin.deploy) from pre-packing these GEMMs; now it is timm's op for op.
        branch = linear(x)
        return residual.add_(branch) if inplace else residual + branch
    shape = residual.shape
    out = residual.reshape(-1, shape[-1])
    if linear.bias is not None:
        out = out.add_(linear.bias) if inplace else out + linear.bias
    elif not inplace:
        out = out.clone()
    return out.addmm_(x.reshape(-1, x.shape[-1]), linear.weight.t()).view(shape)
