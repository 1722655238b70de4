"""A classifier head of one label space loads the head of another on every loading path: the official
21,843-class Google order into timm's 21,841-class fall11 order, and a fall11 head back into Google's.

The reference is the same tiny official-layout checkpoint run with mmpretrain's plain head at 21,843
classes; the row order comes from timm's shipped ``imagenet21k_goog_to_22k_indices.txt``.
"""
import pkgutil

import numpy as np
import pytest
import torch
from mmengine.registry import DefaultScope
from mmengine.runner import load_checkpoint
from mmpretrain.registry import MODELS

from helpers.official_npz import official_arrays, save_npz
from vit_plugin.checkpoint import CheckpointMismatchError, load_checkpoint_strict
from vit_plugin.models.heads import remap_head_rows

WIDTH = 8
TINY_VIT = dict(type='vit_plugin.ViT', arch=dict(embed_dims=WIDTH, num_layers=1, num_heads=2, feedforward_channels=16),
                img_size=16, patch_size=8)
GOOGLE_ONLY = [9205, 15027]  # Google rows of n03931044 and n09859684, which fall11 lacks


def build(head: dict, **classifier):
    head = dict(dict(in_channels=WIDTH, hidden_dim=WIDTH), **head)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(dict(type='ImageClassifier', backbone=TINY_VIT, neck=None, head=head, **classifier))
    return model.eval()


def fall11_head(**kwargs):
    return dict(type='vit_plugin.LabelSpaceClsHead', label_space='fall11', checkpoint_label_space='google21k',
                **kwargs)


def close(a, b):
    """Equal up to the summation order of another output width (a wider or narrower matmul)."""
    return torch.allclose(a, b, rtol=0, atol=1e-6)


def logits(model, images):
    with torch.no_grad():
        return model(images, mode='tensor')


@pytest.fixture(scope='module')
def official(tmp_path_factory):
    """A tiny official in21k checkpoint (pre-logits layer, 21,843 classes), the plain head's logits on it,
    and timm's fall11 -> Google row map."""
    arrays = official_arrays(dim=WIDTH, heads=2, mlp=16, depth=1, patch=8, grid=(2, 2), classes=21843,
                             pre_logits=WIDTH)
    path = save_npz(tmp_path_factory.mktemp('label_space') / 'in21k.npz', arrays)
    reference = build(dict(type='VisionTransformerClsHead', num_classes=21843))
    load_checkpoint(reference, path)
    images = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    text = pkgutil.get_data('timm.data', '_info/imagenet21k_goog_to_22k_indices.txt').decode()
    goog_rows = torch.tensor([int(v) for v in text.split()])
    return dict(path=path, images=images, logits=logits(reference, images), goog_rows=goog_rows)


@pytest.fixture(scope='module')
def fall11_checkpoint(official, tmp_path_factory):
    """The official weights loaded into a fall11 head, saved: a model as pre-trained on timm's shards."""
    model = build(fall11_head())
    load_checkpoint(model, official['path'])
    path = tmp_path_factory.mktemp('fall11') / 'fall11.pth'
    torch.save(dict(state_dict=model.state_dict()), path)
    return str(path)


def test_official_head_through_load_from(official):
    model = build(fall11_head())
    load_checkpoint(model, official['path'])  # what the runner's load_from does
    assert close(logits(model, official['images']), official['logits'][:, official['goog_rows']])


def test_official_head_through_init_cfg(official):
    model = build(fall11_head(), init_cfg=dict(type='Pretrained', checkpoint=official['path']))
    model.init_weights()
    assert close(logits(model, official['images']), official['logits'][:, official['goog_rows']])


def test_official_head_through_the_strict_loader(official):
    """tools/test.py, inference and export load strictly: the head reorders before the shapes are compared."""
    model = build(fall11_head())
    load_checkpoint_strict(model, official['path'])
    assert close(logits(model, official['images']), official['logits'][:, official['goog_rows']])


def test_fall11_head_back_in_google_order(official, fall11_checkpoint):
    model = build(dict(type='vit_plugin.LabelSpaceClsHead', label_space='google21k', checkpoint_label_space='fall11'))
    load_checkpoint_strict(model, fall11_checkpoint)
    shared = [i for i in range(21843) if i not in GOOGLE_ONLY]
    assert close(logits(model, official['images'])[:, shared], official['logits'][:, shared])


def test_classes_the_checkpoint_lacks_start_at_zero(official, fall11_checkpoint):
    model = build(dict(type='vit_plugin.LabelSpaceClsHead', label_space='google21k', checkpoint_label_space='fall11'))
    load_checkpoint_strict(model, fall11_checkpoint)
    assert not logits(model, official['images'])[:, GOOGLE_ONLY].any()


def test_its_own_checkpoint_loads_unchanged(fall11_checkpoint):
    model = build(fall11_head())
    load_checkpoint_strict(model, fall11_checkpoint)
    saved = torch.load(fall11_checkpoint)['state_dict']
    assert all(torch.equal(model.state_dict()[k], saved[k]) for k in saved)


def test_a_plain_head_of_another_space_names_what_to_set(official):
    model = build(dict(type='VisionTransformerClsHead', num_classes=21841))
    with pytest.raises(CheckpointMismatchError, match=r"21843 rows in the checkpoint and 21841 in the model.*"
                                                      r"type='vit_plugin.LabelSpaceClsHead', label_space='fall11', "
                                                      r"checkpoint_label_space='google21k'"):
        load_checkpoint_strict(model, official['path'])


def test_a_head_without_checkpoint_space_names_it(official):
    model = build(dict(type='vit_plugin.LabelSpaceClsHead', label_space='in22k'))
    with pytest.raises(ValueError, match=r"21843 classes, this head 21841 \(fall11\); set "
                                         r"checkpoint_label_space='google21k'"):
        load_checkpoint(model, official['path'])


def test_a_head_of_a_third_size_is_refused(fall11_checkpoint):
    model = build(dict(type='vit_plugin.LabelSpaceClsHead', label_space='imagenet1k', checkpoint_label_space='in21k'))
    with pytest.raises(CheckpointMismatchError, match=r'21841 classes, this head 1000 \(imagenet1k\) or 21843 '
                                                      r"\(google21k\); set checkpoint_label_space='fall11'"):
        load_checkpoint_strict(model, fall11_checkpoint)


def test_num_classes_must_be_the_spaces():
    with pytest.raises(ValueError, match="num_classes=21843, but label_space='fall11' has 21841 classes"):
        build(fall11_head(num_classes=21843))


def test_remap_head_rows_moves_rows_and_zeroes_the_missing():
    weight, bias = torch.arange(12.).reshape(4, 3), torch.tensor([1., 2., 3., 4.])
    new_weight, new_bias = remap_head_rows(weight, bias, np.array([3, -1, 0]))
    assert torch.equal(new_weight, torch.tensor([[9., 10., 11.], [0., 0., 0.], [0., 1., 2.]]))
    assert torch.equal(new_bias, torch.tensor([4., 0., 1.]))


def test_remap_head_rows_refuses_a_row_the_weight_lacks():
    with pytest.raises(ValueError, match=r'index names row 4, but the weight has rows 0..3'):
        remap_head_rows(torch.zeros(4, 3), None, [0, 4])
