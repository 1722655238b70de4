"""ONNX export (tools/deployment/export_onnx.py): ONNX Runtime's outputs match at two batch sizes."""
import json
import os

import numpy as np
import onnx  # noqa: F401  (pinned: a missing package fails here instead of skipping)
import onnxruntime as ort
import pytest
import torch
from mmengine.config import Config

from helpers.tiny_classifier import tiny_demo_checkpoint


def test_onnx_export_matches_onnx_runtime_at_two_batch_sizes(tmp_path, digits_root):
    config, ckpt = tiny_demo_checkpoint(tmp_path, digits_root)
    from vit_plugin.cli.export_onnx import main as export
    out = tmp_path / 'tiny.onnx'
    result = export([config, ckpt, '--out', str(out), '--torch-export', str(tmp_path / 'tiny.pt2'),
                     '--benchmark', '2', '--batch', '2', '--threads', '1'])
    assert out.is_file() and sorted(result['max_abs_diff']) == [1, 3]
    assert max(result['max_abs_diff'].values()) < 1e-4 and result['torch_export_max_abs_diff'] < 1e-4
    assert set(result['benchmark']['median_s']) == {'eager PyTorch', 'frozen compiled (vit_plugin.deploy)',
                                                     'ONNX Runtime'}

    # independent check: the graph's own normalisation and a dynamic batch, against the PyTorch model
    runtime = ort.InferenceSession(str(out), providers=['CPUExecutionProvider'])
    meta = runtime.get_modelmeta().custom_metadata_map
    assert json.loads(meta['classes']) == [str(i) for i in range(10)] and json.loads(meta['mean']) == [127.5] * 3
    assert runtime.get_inputs()[0].shape[0] == 'batch' and runtime.get_inputs()[0].shape[1:] == [3, 32, 32]
    pixels = np.random.default_rng(0).uniform(0, 255, (5, 3, 32, 32)).astype(np.float32)
    from mmpretrain.apis import get_model
    model = get_model(Config.fromfile(config), pretrained=ckpt, device='cpu').eval()
    with torch.no_grad():
        expected = model((torch.from_numpy(pixels) - 127.5) / 127.5, mode='tensor').numpy()
    np.testing.assert_allclose(runtime.run(None, {'images': pixels})[0], expected, rtol=0, atol=1e-4)

    # another resolution: the position embedding is resized once, at load; the graph is fixed at 48 px
    out48 = tmp_path / 'tiny48.onnx'
    export([config, ckpt, '--out', str(out48), '--img-size', '48', '--part', 'backbone'])
    runtime = ort.InferenceSession(str(out48), providers=['CPUExecutionProvider'])
    assert runtime.get_inputs()[0].shape[1:] == [3, 48, 48]
    tokens = runtime.run(None, {'images': pixels.repeat(3, axis=2).repeat(3, axis=3)[:, :, :48, :48]})[0]
    assert tokens.shape == (5, 1 + 6 * 6, 32)

    # 'random' weights (for benchmarks): the config's initialisation, exported and checked alike
    assert export([config, 'random', '--out', str(tmp_path / 'random.onnx')])['onnx'] == str(tmp_path / 'random.onnx')

    # a failed check publishes nothing
    bad = tmp_path / 'bad.onnx'
    with pytest.raises(RuntimeError, match='ONNX Runtime differs from PyTorch'):
        export([config, ckpt, '--out', str(bad), '--atol', '0'])
    assert not bad.exists() and not [p for p in os.listdir(tmp_path) if p.endswith('.part')]
