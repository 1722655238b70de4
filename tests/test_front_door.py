"""What a user meets first: mmpretrain's arch keys, the official weights' input normalisation, running a
trained classifier on images (tools/infer.py) and exporting it to ONNX (tools/deployment/export_onnx.py).
"""
import ast
import json
import os
import os.path as osp

import numpy as np
import onnx  # noqa: F401  (pinned: a missing package fails here instead of skipping)
import onnxruntime as ort
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS

from _official_npz import official_arrays, save_npz
from helpers.common import REPO
from vit_plugin.checkpoint.records import NORM_KEY
from vit_plugin.converters.convert_file import convert_checkpoint_file
from vit_plugin.models import check_input_normalization
from vit_plugin.models.backbones.vit import ViT

TINY = dict(embed_dims=32, num_layers=2, num_heads=4)
IMAGENET = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])


def test_feedforward_channels_is_mlp_dims():
    torch.manual_seed(0)
    ours = ViT(arch=dict(TINY, mlp_dims=64), img_size=32, patch_size=8)
    torch.manual_seed(0)
    theirs = ViT(arch=dict(TINY, feedforward_channels=64), img_size=32, patch_size=8)
    assert ours.arch_settings == theirs.arch_settings
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    images = torch.randn(2, 3, 32, 32)
    assert torch.equal(ours(images)[-1], theirs(images)[-1])
    # the same through a config, as mmpretrain users write it
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        built = MODELS.build(dict(type='vit_plugin.ViT', arch=dict(TINY, feedforward_channels=64), img_size=32,
                                  patch_size=8))
    assert built.blocks[0].mlp.fc1.out_features == 64
    with pytest.raises(ValueError, match='both mlp_dims=64 and feedforward_channels=128'):
        ViT(arch=dict(TINY, mlp_dims=64, feedforward_channels=128))
    with pytest.raises(ValueError, match=r"unknown keys \['mlp_ratio'\]"):
        ViT(arch=dict(TINY, mlp_dims=64, mlp_ratio=4))


def _classifier_cfg(checkpoint, norm):
    return dict(
        type='ImageClassifier',
        data_preprocessor=dict(num_classes=5, to_rgb=True, **norm),
        backbone=dict(type='vit_plugin.ViT', arch=dict(TINY, mlp_dims=64), img_size=32, patch_size=8,
                      init_cfg=dict(type='Pretrained', checkpoint=checkpoint, prefix='backbone.')),
        head=dict(type='VisionTransformerClsHead', num_classes=5, in_channels=32))


def _build(cfg):
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(cfg)
    model.init_weights()
    return model


@pytest.fixture()
def official_checkpoint(tmp_path):
    npz = tmp_path / 'official.npz'
    save_npz(npz, official_arrays())
    dst = str(tmp_path / 'official.pth')
    convert_checkpoint_file(str(npz), dst, show_progress=False)
    return dst


def test_official_weights_warn_under_imagenet_normalisation_only(official_checkpoint, tmp_path):
    state = torch.load(official_checkpoint, map_location='cpu', weights_only=True)['state_dict']
    assert state[f'backbone.{NORM_KEY}'].tolist() == [[127.5] * 3, [127.5] * 3]  # the converter records it

    model = _build(_classifier_cfg(official_checkpoint, IMAGENET))
    (message, ) = check_input_normalization(model, warn=False)
    assert 'mean=[127.5, 127.5, 127.5], std=[127.5, 127.5, 127.5]' in message  # what the weights expect
    assert 'mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]' in message  # what the config does
    assert 'model.data_preprocessor.mean' in message  # and how to fix it
    assert check_input_normalization(_build(_classifier_cfg(official_checkpoint, dict(mean=[127.5] * 3,
                                                                                     std=[127.5] * 3)))) == []
    unnormalised = _classifier_cfg(official_checkpoint, {})
    (message, ) = check_input_normalization(_build(unnormalised), warn=False)
    assert 'does not normalise its inputs' in message

    # the record travels with fine-tuned weights: saved again, consumed again by a strict load
    saved = model.state_dict()
    assert saved[f'backbone.{NORM_KEY}'].tolist() == [[127.5] * 3, [127.5] * 3]
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        fresh = MODELS.build(dict(_classifier_cfg(None, IMAGENET), backbone=dict(
            type='vit_plugin.ViT', arch=dict(TINY, mlp_dims=64), img_size=32, patch_size=8)))
    assert check_input_normalization(fresh) == []  # random weights: nothing recorded, nothing to say
    fresh.load_state_dict(saved, strict=True)
    assert len(check_input_normalization(fresh, warn=False)) == 1

    # the runner hook that tools/train.py and tools/test.py add logs it once per run
    from vit_plugin.apis import train

    args = train.parse_args([osp.join(REPO, 'configs', 'vit_demo_digits.py')])
    cfg = train.merge_args(Config.fromfile(args.config), args)
    assert cfg.default_hooks.input_norm_check == dict(type='vit_plugin.InputNormCheckHook')
    from vit_plugin.engine.hooks import InputNormCheckHook

    class Runner:
        warnings = []
        logger = type('Logger', (), {'warning': lambda self, message: Runner.warnings.append(message)})()
    Runner.model = model
    hook = InputNormCheckHook()
    hook.before_train(Runner)
    hook.before_val(Runner)
    hook.before_test(Runner)
    assert len(Runner.warnings) == 1 and 'were trained on inputs normalised with' in Runner.warnings[0]


def test_models_do_not_import_converters():
    """Key names live in vit_plugin.checkpoint.records and key_maps, which both use; models never import converters
    and the checkpoint package imports neither (no import cycle)."""
    root = osp.join(REPO, 'vit_plugin')
    for package, forbidden in (('models', ('converters', )), ('checkpoint', ('converters', 'models'))):
        for folder, _, files in os.walk(osp.join(root, package)):
            for name in (f for f in files if f.endswith('.py')):
                path = osp.join(folder, name)
                tree = ast.parse(open(path).read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.ImportFrom):
                        targets = [node.module or ''] + [a.name for a in node.names]
                    elif isinstance(node, ast.Import):
                        targets = [a.name for a in node.names]
                    else:
                        continue
                    for target in targets:
                        parts = target.split('.')
                        assert not any(f in parts for f in forbidden), f'{osp.relpath(path, REPO)} imports {target}'


def _tiny_demo_checkpoint(tmp_path, digits_root):
    """configs/vit_demo_digits.py shrunk to a 2-block ViT, random weights, saved as a runner
    checkpoint with the digits' class names (what tools/infer.py and the exporter read)."""
    cfg = tmp_path / 'tiny.py'
    cfg.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
model = dict(backbone=dict(arch=dict(_delete_=True, embed_dims=32, num_layers=2, num_heads=2, feedforward_channels=64)),
             head=dict(in_channels=32))
test_dataloader = dict(dataset=dict(data_root={digits_root!r}))
val_dataloader = test_dataloader
""")
    config = Config.fromfile(str(cfg))
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(config.model)
    model.init_weights()
    torch.manual_seed(0)
    with torch.no_grad():  # the head starts at zero (constant logits): make every output depend on the weights
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    ckpt = tmp_path / 'tiny.pth'
    torch.save(dict(meta=dict(dataset_meta=dict(classes=[str(i) for i in range(10)])), state_dict=model.state_dict()),
               ckpt)
    return str(cfg), str(ckpt)


def test_onnx_export_matches_onnx_runtime_at_two_batch_sizes(tmp_path, digits_root):
    config, ckpt = _tiny_demo_checkpoint(tmp_path, digits_root)
    from vit_plugin.apis.export_onnx import main as export
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


def test_test_tool_reports_the_models_own_top1_on_the_test_split(tmp_path, digits_root):
    """tools/test.py (vit_plugin.apis.test): the top-1 it prints and writes with --out is the accuracy of
    the checkpoint's predictions on the config's test split, counted here image by image."""
    config, ckpt = _tiny_demo_checkpoint(tmp_path, digits_root)
    from mmengine.dataset import pseudo_collate
    from mmpretrain.apis import get_model
    from mmpretrain.registry import DATASETS

    from vit_plugin.apis.test import main as test_main
    out = tmp_path / 'metrics.json'
    metrics = test_main([config, ckpt, '--work-dir', str(tmp_path / 'work'), '--out', str(out)])
    assert json.loads(out.read_text()) == {'accuracy/top1': pytest.approx(metrics['accuracy/top1'])}

    cfg = Config.fromfile(config)
    model = get_model(cfg, pretrained=ckpt, device='cpu').eval()
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        dataset = DATASETS.build(cfg.test_dataloader.dataset)
    right = 0
    with torch.no_grad():
        for start in range(0, len(dataset), 64):
            batch = pseudo_collate([dataset[i] for i in range(start, min(start + 64, len(dataset)))])
            for sample in model.test_step(batch):
                right += int(sample.pred_label.item() == sample.gt_label.item())
    assert len(dataset) == 359 and 0 < right < len(dataset)
    assert metrics['accuracy/top1'] == pytest.approx(100 * right / len(dataset), abs=1e-4)

    with pytest.raises(SystemExit):  # evaluation has no XLA path: the launcher is refused up front
        test_main([config, ckpt, '--launcher', 'xla'])


@pytest.mark.slow
def test_infer_names_the_digits_of_a_trained_classifier(tmp_path, digits_root):
    """tools/infer.py on a demo classifier trained for 20 epochs: the top-1 names of held-out test digits
    are right (the same images tools/test.py evaluates), top-k is ordered, folders are searched."""
    import subprocess
    import sys

    from helpers.common import run_env
    epochs = 20
    cfg = tmp_path / 'demo.py'
    cfg.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
max_epochs = {epochs}
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, end_factor=1.0, by_epoch=True, begin=0, end=2, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=2, end=max_epochs, convert_to_iter_based=True)]
train_cfg = dict(max_epochs=max_epochs, val_interval=100)
train_dataloader = dict(dataset=dict(data_root={digits_root!r}))
val_dataloader = dict(dataset=dict(data_root={digits_root!r}))
test_dataloader = val_dataloader
default_hooks = dict(checkpoint=dict(interval={epochs}))
""")
    work = tmp_path / 'work'
    proc = subprocess.run([sys.executable, osp.join(REPO, 'tools', 'train.py'), str(cfg), '--work-dir', str(work)],
                          env=run_env(), capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = str(work / f'epoch_{epochs}.pth')

    test_root = osp.join(digits_root, 'test')
    images = [osp.join(test_root, str(c), name) for c in range(10)
              for name in sorted(os.listdir(osp.join(test_root, str(c))))[:4]]
    from vit_plugin.apis.infer import main as infer
    out = tmp_path / 'pred.json'
    results = infer([str(cfg), ckpt, *images, '--topk', '3', '--batch-size', '16', '--out', str(out)])
    assert [r['image'] for r in results] == images and json.loads(out.read_text()) == results
    right = sum(r['topk'][0]['name'] == osp.basename(osp.dirname(r['image'])) for r in results)
    print(f'tools/infer.py: {right} of 40 test digits named right')
    assert right >= 36, [(r['image'], r['topk'][0]) for r in results]
    for r in results:
        scores = [e['score'] for e in r['topk']]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True) and sum(scores) <= 1 + 1e-6
        assert {e['name'] for e in r['topk']} <= {str(i) for i in range(10)}
    folder = infer([str(cfg), ckpt, osp.join(test_root, '7'), '--topk', '1'])
    assert len(folder) == len(os.listdir(osp.join(test_root, '7')))
    assert sum(r['topk'][0]['name'] == '7' for r in folder) >= 0.85 * len(folder)
    with pytest.raises(SystemExit, match='no such file or folder'):
        infer([str(cfg), ckpt, str(tmp_path / 'missing.png')])
