"""Images for the attention analyses: from a config's dataset or from files, as the model sees them."""
import copy
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

from vit_plugin.compat import mmengine as mmengine_compat


def _preprocessor(model: nn.Module):
    pre = getattr(model, 'data_preprocessor', None)
    if pre is None:
        raise ValueError(f'{type(model).__name__} has no data_preprocessor; build the model from a full '
                         f'mmpretrain/mmdet config (with its data_preprocessor)')
    return pre


def _to_display(inputs: torch.Tensor, model: nn.Module) -> np.ndarray:
    """Undo the preprocessor's normalisation: (B, C, H, W) -> (B, H, W, 3) floats in [0, 1]."""
    pre = _preprocessor(model)
    x = inputs.detach().float().cpu()
    mean, std = getattr(pre, 'mean', None), getattr(pre, 'std', None)
    if mmengine_compat.normalizes(pre, default=mean is not None) and mean is not None and std is not None:
        x = x * std.detach().float().cpu().reshape(1, -1, 1, 1) + mean.detach().float().cpu().reshape(1, -1, 1, 1)
        x = x / 255.0 if float(mean.max()) > 1.5 else x  # mean/std given in 0..255 units (mmpretrain's way)
    else:
        lo, hi = x.amin(dim=(1, 2, 3), keepdim=True), x.amax(dim=(1, 2, 3), keepdim=True)
        x = (x - lo) / (hi - lo).clamp_min(1e-8)
    if x.shape[1] == 1:
        x = x.repeat(1, 3, 1, 1)
    return x[:, :3].clamp(0, 1).permute(0, 2, 3, 1).numpy()


def images_from_config(cfg, model: nn.Module, num_images: int = 16, split: str = 'test',
                       device: str = 'cpu') -> Tuple[torch.Tensor, np.ndarray]:
    """``num_images`` test images spread over the config's dataset -> (normalised inputs on ``device``,
    display images (B, H, W, 3) in [0, 1])."""
    from mmengine.runner import Runner

    key = f'{split}_dataloader'
    loader_cfg = cfg.get(key) or cfg.get('val_dataloader') or cfg.get('test_dataloader')
    if not loader_cfg:
        raise ValueError(f'the config has no {key} (nor val_dataloader) to take images from; pass --images FILE ...')
    loader_cfg = copy.deepcopy(loader_cfg)
    loader_cfg.update(num_workers=0, persistent_workers=False, sampler=dict(type='DefaultSampler', shuffle=False))
    loader = Runner.build_dataloader(loader_cfg)
    if len(loader.dataset) == 0:
        raise ValueError(f'the {split} dataset of the config is empty')
    indices = np.unique(np.linspace(0, len(loader.dataset) - 1, num_images).round().astype(int))
    inputs = []
    for start in range(0, len(indices), 32):
        batch = loader.collate_fn([loader.dataset[int(i)] for i in indices[start:start + 32]])
        inputs.append(_preprocessor(model)(batch, False)['inputs'])
    inputs = torch.cat(inputs).to(device)
    return inputs, _to_display(inputs, model)


def images_from_files(paths: Sequence[str], model: nn.Module, size: Tuple[int, int],
                      device: str = 'cpu') -> Tuple[torch.Tensor, np.ndarray]:
    """Image files resized to ``size`` (H, W) and normalised like the model's training data."""
    from PIL import Image

    pre = _preprocessor(model)
    tensors: List[torch.Tensor] = []
    for path in paths:
        with Image.open(path) as img:
            arr = np.asarray(img.convert('RGB').resize((size[1], size[0]), Image.BICUBIC))
        tensor = torch.from_numpy(arr.copy()).permute(2, 0, 1)
        # mmpretrain's preprocessor (to_rgb=True) expects OpenCV's BGR order and flips it to RGB.
        if mmengine_compat.converts_channels(pre):
            tensor = tensor[[2, 1, 0]]
        tensors.append(tensor)
    inputs = pre(dict(inputs=tensors), False)['inputs'].to(device)
    return inputs, _to_display(inputs, model)


def load_images(cfg, model: nn.Module, vit: nn.Module, num_images: int, files: Optional[Sequence[str]] = None,
                split: str = 'test', device: str = 'cpu') -> Tuple[torch.Tensor, np.ndarray]:
    """Images from ``files`` when given, else from the config's dataset."""
    if files:
        return images_from_files(files, model, vit.img_size, device)
    return images_from_config(cfg, model, num_images, split, device)
