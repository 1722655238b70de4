"""The official weights' input normalisation: a classifier built on them warns when its data
preprocessor normalises with other statistics (``check_input_normalization``, ``InputNormCheckHook``)."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS

from helpers.common import REPO
from helpers.official_npz import official_arrays, save_npz
from vit_plugin.checkpoint.records import NORM_KEY
from vit_plugin.converters.convert_file import convert_checkpoint_file
from vit_plugin.models import check_input_normalization


TINY = dict(embed_dims=32, num_layers=2, num_heads=4)
IMAGENET = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])


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
    from vit_plugin.cli import train

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
