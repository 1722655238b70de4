"""The operators of mmcv's compiled extension that our models use, from torchvision and torch.

Loaded *as* ``mmcv._ext`` when mmcv has none, so it imports only torch, torchvision and the start-up
hook module, without relative imports. Every other attribute raises :class:`MissingCompiledOpError`
when called. See docs/installation.md#where-mmcvs-operators-come-from."""
import struct
import sys

import torch
import torch.nn.functional as F
import torchvision  # noqa: F401  (registers the torch.ops.torchvision kernels)
from _vit_plugin_mmcv_ext import MissingCompiledOpError

__all__ = ['nms', 'roi_align_forward', 'roi_align_backward', 'sigmoid_focal_loss_forward',
           'sigmoid_focal_loss_backward', 'get_compiler_version', 'get_compiling_cuda_version',
           'MissingCompiledOpError', 'PROVIDED']

#: Marks this module as vit_plugin's provider (a compiled ``mmcv._ext`` has no such attribute).
VIT_PLUGIN_PROVIDER = True

#: The operators implemented here; every other name raises :class:`MissingCompiledOpError`.
PROVIDED = ('nms', 'roi_align_forward', 'roi_align_backward', 'sigmoid_focal_loss_forward',
            'sigmoid_focal_loss_backward', 'get_compiler_version', 'get_compiling_cuda_version')

HOW_TO_GET_COMPILED = (
    'To get it: `MMCV_OPS=compiled make setup` (or `MMCV_WHEEL=<wheel> make setup`), or install a compiled '
    'mmcv built for your torch (docs/installation.md, "Compiled mmcv").')


def _float32(value):
    """``value`` rounded to float32 and returned as a Python float (mmcv passes thresholds as C floats)."""
    return struct.unpack('f', struct.pack('f', float(value)))[0]


# --------------------------------------------------------------------------------------------- NMS
def nms(boxes, scores, iou_threshold, offset=0):
    """int64 indices of the ``boxes`` (N, 4; x1, y1, x2, y2) that greedy NMS keeps, highest ``scores`` first.

    mmcv's ``ext_module.nms``: overlap above ``iou_threshold`` drops a box; ``offset`` 1 is the legacy
    ``x2 - x1 + 1`` width.
    """
    if boxes.numel() == 0:
        return boxes.new_empty((0, ), dtype=torch.long)
    if offset not in (0, 1):
        raise ValueError(f'nms: offset must be 0 or 1, got {offset}')
    cpu_kernel_dtype = boxes.dtype in (torch.float32, torch.float64)
    if boxes.dtype != scores.dtype or (boxes.device.type == 'cpu' and not cpu_kernel_dtype):
        # torchvision needs one dtype; float32 keeps the score order of fp16/bf16 scores and boxes
        boxes, scores = boxes.float(), scores.float()
    if offset:
        # Widening every box by `offset` at its far corner gives the same intersections and areas as
        # mmcv's `x2 - x1 + offset`.
        boxes = torch.cat([boxes[:, :2], boxes[:, 2:] + offset], dim=1)
    # mmcv visits the boxes in the order of `scores.sort(descending=True)`, which is not stable: tied scores
    # come in that sort's order. torchvision sorts stably, so it keeps the order of boxes already sorted.
    order = scores.sort(0, descending=True)[1]
    keep = torch.ops.torchvision.nms(boxes[order], scores[order], _float32(iou_threshold))
    return order[keep]


# --------------------------------------------------------------------------------------------- RoIAlign
def _check_pool_mode(pool_mode):
    if pool_mode != 1:
        raise MissingCompiledOpError(
            "RoIAlign with pool_mode='max' needs compiled mmcv; without it, RoIAlign has pool_mode='avg' only "
            "(mmdet's default). " + HOW_TO_GET_COMPILED)


def _cpu_float(tensor):
    """fp16 / bf16 maps pooled in float32 (torchvision has no CPU kernel for them)."""
    if tensor.device.type == 'cpu' and tensor.dtype not in (torch.float32, torch.float64):
        return tensor.float()
    return tensor


def roi_align_forward(input, rois, output, argmax_y, argmax_x, aligned_height, aligned_width, spatial_scale,
                      sampling_ratio, pool_mode, aligned):
    """RoIAlign forward into ``output`` (mmcv's ``ext_module.roi_align_forward``), average pooling.

    ``rois`` is (K, 5): batch index, x1, y1, x2, y2 in image coordinates, scaled by ``spatial_scale``."""
    _check_pool_mode(pool_mode)
    input = _cpu_float(input)
    if rois.dtype != input.dtype:
        rois = rois.to(input.dtype)
    result = torch.ops.torchvision.roi_align(input, rois, float(spatial_scale), int(aligned_height),
                                             int(aligned_width), int(sampling_ratio), bool(aligned))
    output.copy_(result)


def roi_align_backward(grad_output, rois, argmax_y, argmax_x, grad_input, aligned_height, aligned_width,
                       spatial_scale, sampling_ratio, pool_mode, aligned):
    """Add RoIAlign's input gradient to ``grad_input`` (deterministic CPU kernel under deterministic mode)."""
    _check_pool_mode(pool_mode)
    grad_output = _cpu_float(grad_output)
    batch, channels, height, width = grad_input.shape
    if rois.dtype != grad_output.dtype:
        rois = rois.to(grad_output.dtype)
    args = (float(spatial_scale), int(aligned_height), int(aligned_width), batch, channels, height, width,
            int(sampling_ratio), bool(aligned))
    from vit_plugin.compat import torchvision as torchvision_compat  # local: loaded as mmcv._ext before vit_plugin
    if grad_output.device.type != 'cpu' and torch.are_deterministic_algorithms_enabled():
        cpu_grad = _cpu_float(grad_output.cpu())
        grad = torchvision_compat.roi_align_backward(cpu_grad, rois.cpu().to(cpu_grad.dtype), *args)
    else:
        grad = torchvision_compat.roi_align_backward(grad_output, rois, *args)
    grad_input.add_(grad.to(grad_input.device, grad_input.dtype))


# --------------------------------------------------------------------------------------------- focal loss
def _focal_parts(input, target, weight):
    """float32 (or float64) logits, the positive-class mask and the per-row class weight (or None)."""
    if input.dim() != 2 or target.dim() != 1 or target.size(0) != input.size(0):
        raise ValueError(f'sigmoid focal loss: expects (N, C) logits and (N, ) targets, got '
                         f'{tuple(input.shape)} and {tuple(target.shape)}')
    x = input if input.dtype == torch.float64 else input.float()
    classes = torch.arange(input.size(1), device=input.device)
    positive = target[:, None] == classes[None, :]  # a background target (== C) matches no class
    row_weight = None
    if weight is not None and weight.numel() > 0:
        if bool((target >= input.size(1)).any()):
            raise ValueError('sigmoid focal loss: a per-class weight cannot weigh background targets '
                             '(target == num_classes); pass weight=None and weigh the loss afterwards, as mmdet '
                             'does')
        row_weight = weight.to(x.dtype)[target][:, None]
    return x, positive, row_weight


def sigmoid_focal_loss_forward(input, target, weight, output, gamma, alpha):
    """Element-wise sigmoid focal loss into ``output`` (mmcv's CUDA kernel formulas, any device).

    ``target`` holds a class index per row; ``num_classes`` is background. Log-sigmoids keep the
    loss exact for confident logits."""
    x, positive, row_weight = _focal_parts(input, target, weight)
    p, q = torch.sigmoid(x), torch.sigmoid(-x)  # q = 1 - p
    log_p, log_q = F.logsigmoid(x), F.logsigmoid(-x)
    loss = torch.where(positive, -alpha * q.pow(gamma) * log_p, -(1 - alpha) * p.pow(gamma) * log_q)
    if row_weight is not None:
        loss = loss * row_weight
    output.copy_(loss)


def sigmoid_focal_loss_backward(input, target, weight, grad_input, gamma, alpha):
    """The loss's derivative with respect to the logits into ``grad_input``."""
    x, positive, row_weight = _focal_parts(input, target, weight)
    p, q = torch.sigmoid(x), torch.sigmoid(-x)
    log_p, log_q = F.logsigmoid(x), F.logsigmoid(-x)
    term_p = q.pow(gamma) * (q - gamma * p * log_p)
    term_n = p.pow(gamma) * (gamma * q * log_q - p)
    grad = torch.where(positive, -alpha * term_p, -(1 - alpha) * term_n)
    if row_weight is not None:
        grad = grad * row_weight
    grad_input.copy_(grad)


# --------------------------------------------------------------------------------------------- build info
def get_compiler_version():
    """What ``mmcv.utils.collect_env`` reports as "MMCV Compiler": nothing was compiled for mmcv."""
    return f'none (mmcv without compiled code; ops from torchvision {torchvision.__version__} via vit_plugin)'


def get_compiling_cuda_version():
    """The CUDA version of the kernels in use (torchvision's, i.e. torch's), or mmcv's "not available"."""
    return torch.version.cuda or 'not available'


# --------------------------------------------------------------------------------------------- the rest
_missing = {}


def _missing_op(name):
    def missing(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get('__name__', '?')
        raise MissingCompiledOpError(
            f"{caller} needs mmcv's compiled operator '{name}': this installation has mmcv without compiled "
            f'code. {HOW_TO_GET_COMPILED}')

    missing.__name__ = missing.__qualname__ = name
    missing.__doc__ = f"mmcv's compiled operator '{name}': not available without compiled mmcv."
    return missing


def __getattr__(name):
    # mmcv's loader asserts that every operator name it lists exists: give each one a callable that
    # explains itself when called. Dunder and private names stay ordinary missing attributes.
    if name.startswith('_'):
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    if name not in _missing:
        _missing[name] = _missing_op(name)
    return _missing[name]
