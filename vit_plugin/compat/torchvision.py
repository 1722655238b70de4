"""Private operators of torchvision, through ``torch.ops.torchvision``; checked against 0.24.0 and 0.29.2."""
import torch

__all__ = ['roi_align_backward', 'cuda_version']


def roi_align_backward(grad_output: torch.Tensor, rois: torch.Tensor, *args) -> torch.Tensor:
    """RoIAlign's input gradient from saved ``args`` only (``_roi_align_backward``): spatial_scale, pooled
    h, w, batch, channels, height, width, sampling_ratio, aligned."""
    return torch.ops.torchvision._roi_align_backward(grad_output, rois, *args)


def cuda_version() -> int:
    """The CUDA version torchvision's operator library was compiled for (e.g. 12080), -1 without CUDA."""
    return torch.ops.torchvision._cuda_version()


INHERITED: dict = {}
