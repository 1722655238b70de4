"""Private operators of torchvision that vit_plugin needs, reached through ``torch.ops.torchvision``.

Checked against torchvision 0.24.0 and 0.29.2.
"""
import torch

__all__ = ['roi_align_backward', 'cuda_version']


def roi_align_backward(grad_output: torch.Tensor, rois: torch.Tensor, *args) -> torch.Tensor:
    """The gradient of RoIAlign with respect to its input, for mmcv's ``roi_align`` backward.

    ``torchvision.ops.roi_align`` differentiates through autograd, which needs the forward's graph;
    mmcv's op calls its backward with the saved arguments only, which torchvision offers as the
    ``_roi_align_backward`` operator. ``args``: spatial_scale, pooled height and width, batch,
    channels, height, width, sampling_ratio, aligned.
    """
    return torch.ops.torchvision._roi_align_backward(grad_output, rois, *args)


def cuda_version() -> int:
    """The CUDA version torchvision's operators were compiled for (e.g. 12080), -1 without CUDA.

    ``torchvision.version.cuda`` is the build's string and says nothing about the loaded operator
    library; ``_cuda_version`` asks the library itself.
    """
    return torch.ops.torchvision._cuda_version()


INHERITED: dict = {}
