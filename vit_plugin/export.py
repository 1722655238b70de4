"""ONNX and ``torch.export`` export, checked against PyTorch.

See docs/inference.md#export-to-onnx-toolsdeploymentexport_onnxpy."""
import json
import os
import os.path as osp
import tempfile
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from vit_plugin.compat import mmpretrain as mmpretrain_compat
from vit_plugin.checkpoint.strict_load import checkpoint_classes, load_checkpoint_strict
from vit_plugin.models.input_norm import preprocessor_norm


class ExportWrapper(nn.Module):
    """``(x - mean) / std`` on 0..255 RGB pixels, then ``part`` 'classifier' (logits) or 'backbone' (tokens)."""

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float], part: str = 'classifier'):
        super().__init__()
        if part not in ('classifier', 'backbone'):
            raise ValueError(f"part must be 'classifier' or 'backbone', got {part!r}")
        if part == 'backbone' and not hasattr(getattr(model, 'backbone', None), 'forward_features'):
            raise ValueError(f'{type(model).__name__} has no ViT backbone with forward_features to export.')
        self.model = model.eval()
        self.part = part
        self.register_buffer('mean', torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer('std', torch.tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = (images - self.mean) / self.std
        if self.part == 'backbone':
            return self.model.backbone.forward_features(x)
        return self.model(x, mode='tensor')


def build_model(cfg, checkpoint: Optional[str], backbone_only: bool = False,
                option: str = '--backbone-only') -> nn.Module:
    """The model of ``cfg`` in eval mode on the CPU, ``checkpoint`` loaded strictly (None: initialisation).

    Raises CheckpointMismatchError when the checkpoint does not fit the config's model."""
    from mmpretrain.apis import get_model

    model = get_model(cfg, pretrained=False, device='cpu')
    if checkpoint is None:
        model.init_weights()
    else:
        loaded = load_checkpoint_strict(model, checkpoint, backbone_only, option)
        classes = None if backbone_only else checkpoint_classes(loaded)  # another head's names otherwise
        if classes:
            mmpretrain_compat.set_dataset_meta(model, classes)
    return model.eval()


def normalization_of(model: nn.Module) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """The (mean, std) the model's data preprocessor applies (identity when it does not normalise)."""
    norm = preprocessor_norm(model)
    return norm if norm is not None else ((0., 0., 0.), (1., 1., 1.))


def sample_images(batch: int, img_size: Tuple[int, int], seed: int = 0) -> torch.Tensor:
    """Random 0..255 pixels, the inputs the parity check compares on."""
    return torch.rand(batch, 3, *img_size, generator=torch.Generator().manual_seed(seed)) * 255


def onnx_parity(onnx_path: str, wrapper: nn.Module, img_size: Tuple[int, int],
                batch_sizes: Sequence[int] = (1, 3)) -> Dict[int, float]:
    """Largest |ONNX Runtime - PyTorch| per batch size, on the same random images."""
    import numpy as np
    import onnxruntime as ort
    session = ort.InferenceSession(onnx_path, providers=['CPUExecutionProvider'])
    name = session.get_inputs()[0].name
    diffs = {}
    for batch in batch_sizes:
        images = sample_images(batch, img_size, seed=batch)
        with torch.no_grad():
            expected = wrapper(images).numpy()
        got = session.run(None, {name: images.numpy()})[0]
        if got.shape != expected.shape:
            raise RuntimeError(f'ONNX output shape {got.shape} != PyTorch {expected.shape} at batch {batch}')
        diffs[batch] = float(np.abs(got - expected).max())
    return diffs


def export_onnx(wrapper: ExportWrapper, dst: str, img_size: Tuple[int, int], opset: int = 17,
                atol: float = 1e-4, metadata: Optional[Dict[str, str]] = None) -> Dict[int, float]:
    """Write ``wrapper`` as ONNX to ``dst`` once ONNX Runtime matches PyTorch; returns batch -> max difference.

    Raises RuntimeError, writing nothing, when the outputs differ by more than ``atol``."""
    import onnx
    output = 'logits' if wrapper.part == 'classifier' else 'tokens'
    directory = osp.dirname(osp.abspath(dst))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix='.onnx.part', dir=directory)
    os.close(fd)
    try:
        # The TorchScript-based exporter: it needs no extra packages and handles the whole ViT
        # (scaled_dot_product_attention exports as MatMul/Softmax from opset 14).
        torch.onnx.export(wrapper, (sample_images(2, img_size), ), tmp, input_names=['images'],
                          output_names=[output], dynamic_axes={'images': {0: 'batch'}, output: {0: 'batch'}},
                          opset_version=opset, dynamo=False)
        model = onnx.load(tmp)
        onnx.checker.check_model(model)
        meta = dict(metadata or {}, input='RGB float32 pixels 0..255, (batch, 3, H, W)',
                    mean=json.dumps(wrapper.mean.flatten().tolist()), std=json.dumps(wrapper.std.flatten().tolist()),
                    img_size=json.dumps(list(img_size)), output=output)
        for key, value in meta.items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, str(value)
        onnx.save(model, tmp)
        diffs = onnx_parity(tmp, wrapper, img_size)
        worst = max(diffs.values())
        if worst > atol:
            raise RuntimeError(f'ONNX Runtime differs from PyTorch by {worst:.2e} (> {atol:g}) on the same '
                               f'inputs (per batch size: {diffs}); {dst} was not written.')
        os.replace(tmp, dst)
        return diffs
    finally:
        if osp.exists(tmp):
            os.remove(tmp)


def export_program(wrapper: nn.Module, dst: str, img_size: Tuple[int, int], max_batch: int = 1024):
    """``torch.export`` the wrapper (dynamic batch) and save it (``.pt2``); returns max |exported - eager|."""
    from torch.export import Dim
    batch = Dim('batch', min=1, max=max_batch)
    program = torch.export.export(wrapper, (sample_images(2, img_size), ), dynamic_shapes=({0: batch}, ))
    images = sample_images(3, img_size, seed=3)
    with torch.no_grad():
        diff = float((program.module()(images) - wrapper(images)).abs().max())
    directory = osp.dirname(osp.abspath(dst))
    fd, tmp = tempfile.mkstemp(suffix='.pt2.part', dir=directory)
    os.close(fd)
    try:
        torch.export.save(program, tmp)
        os.replace(tmp, dst)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)
    return diff
