"""The memory planner (tools/analysis/memory.py) against what PyTorch really keeps and uses.

Two references: the tensors autograd saves in a real encoder block's forward pass (caught with
``torch.autograd.graph.saved_tensors_hooks``, counted once per storage), and the peak memory of
real CPU training steps of a config (measured in a child process).
"""
import os.path as osp

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from helpers.common import REPO
from vit_plugin.cli.common import run
from benchmarks import memory_planner as memory_tool
from benchmarks.memory_measure import measure
from benchmarks.memory_planner import (BlockShape, Precision, block_activation_bytes, estimate,
                                                  largest_batch, model_shape, parse_size)
from vit_plugin.evaluation.model_loading import load_config
from vit_plugin.models.layers import EncoderBlock


def saved_bytes(block, x, grid):
    params = {StorageWeakRef(p.untyped_storage()) for p in block.parameters()}
    storages = {}

    def pack(t):
        ref = StorageWeakRef(t.untyped_storage())
        if ref not in params:
            storages[ref] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, grid=grid)
    return sum(storages.values())


@pytest.mark.parametrize('kw', [
    dict(prefix=1, grid=(14, 14)),  # the classifier's block: fused attention
    dict(prefix=1, grid=(14, 14), drop=0.1, drop_path=0.1),  # pre-training: dropout masks
    dict(prefix=1, grid=(20, 30), window=7),  # windowed, class token, padded rows
    dict(prefix=0, grid=(20, 30), window=7, rel_pos=True),  # ViTDet block without class token
    dict(prefix=1, grid=(20, 30), window=7, rel_pos=True),
    dict(prefix=0, grid=(21, 26), window=7, rel_pos=True),  # padded columns
    dict(prefix=1, grid=(20, 30), rel_pos=True),  # global block with relative position bias
], ids=lambda kw: '-'.join(f'{k}{v}' for k, v in kw.items()))
def test_block_activations_match_what_autograd_saves(kw):
    torch.manual_seed(0)
    dims, heads, mlp = 96, 3, 384
    rows, cols = kw['grid']
    tokens = kw['prefix'] + rows * cols
    block = EncoderBlock(dims, heads, mlp, drop=kw.get('drop', 0.), drop_path=kw.get('drop_path', 0.),
                         window_size=kw.get('window', 0), num_prefix_tokens=kw['prefix'],
                         rel_pos_grid=kw['grid'] if kw.get('rel_pos') else None).train()
    batch = 3
    got = saved_bytes(block, torch.randn(batch, tokens, dims, requires_grad=True), kw['grid']) / batch
    shape = BlockShape(tokens=tokens, prefix=kw['prefix'], grid=kw['grid'], dims=dims, heads=heads, mlp_dims=mlp,
                       window=kw.get('window', 0), rel_pos=kw.get('rel_pos', False), drop=kw.get('drop', 0.))
    terms = block_activation_bytes(shape, Precision.make(bf16=False, device='cpu'), 'cpu')
    est = sum(v for k, v in terms.items() if k != 'temporaries')
    # What is left is batch-independent (the gathered relative-position tables, < 2 %).
    assert est == pytest.approx(got, rel=0.02)


def test_checkpointing_and_bf16_shrink_activations_as_modelled():
    block = BlockShape(tokens=197, prefix=1, grid=(14, 14), dims=768, heads=12, mlp_dims=3072)
    fp32 = block_activation_bytes(block, Precision.make(False, 'cuda'), 'cuda')
    bf16 = block_activation_bytes(block, Precision.make(True, 'cuda'), 'cuda')
    assert bf16['mlp'] == fp32['mlp'] / 2 and bf16['stream'] == fp32['stream']  # residual stream stays fp32


# Ti/16 at 224 with a 1000-class head: big enough that tensors dominate the process's memory,
# small enough to train two steps in seconds.
TINY = {'model.backbone.arch': 'ti', 'model.head.in_channels': 192, 'model.head.hidden_dim': None,
        'model.head.num_classes': 1000}


@pytest.mark.slow
def test_estimate_matches_measured_cpu_training_peak():
    config = osp.join(REPO, 'configs', 'vit_b16_in21k.py')
    cfg = load_config(config, dict(TINY))
    shape = model_shape(cfg)
    measured = measure(config, 4, cfg_options=TINY)
    assert measured['params'] == shape.params
    est = estimate(shape, 4, device='cpu')
    assert est.peak == pytest.approx(measured['peak'], rel=0.10), (est, measured)


def test_largest_batch_is_the_last_that_fits():
    cfg = load_config(osp.join(REPO, 'configs', 'vit_b16_in21k.py'))
    shape = model_shape(cfg)
    budget = parse_size('24GiB')
    n = largest_batch(shape, budget, device='cuda')
    assert estimate(shape, n, device='cuda').peak <= budget < estimate(shape, n + 1, device='cuda').peak
    assert largest_batch(shape, budget, device='cuda', with_cp=True) > n  # checkpointing buys batch
    assert shape.params == sum(p.numel() for p in _built(cfg).parameters())


def _built(cfg):
    from mmengine.registry import MODELS
    with torch.device('meta'):
        return MODELS.build(cfg.model)


def test_cli_prints_the_table(capsys):
    assert run(memory_tool.main, [osp.join(REPO, 'configs', 'vit_b16_in21k.py'), '--batch', '16',
                                  '--gpu-mem', '16GiB', '--with-cp', '--bf16']) == 0
    out = capsys.readouterr().out
    for needle in ('bf16 autocast', 'activation checkpointing on', 'optimizer state (AdamW)',
                   'activations, batch 16', 'largest batch per device within 16GiB'):
        assert needle in out, out
    assert run(memory_tool.main, [osp.join(REPO, 'configs', 'vit_b16_in21k.py'), '--gpu-mem', 'lots']) == 2
    assert 'cannot read memory size' in capsys.readouterr().err


def test_parse_size():
    assert parse_size('24GiB') == 24 * 1024**3 and parse_size('80GB') == 80e9 and parse_size('512MiB') == 2**29
