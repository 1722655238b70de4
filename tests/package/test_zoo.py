"""vit_plugin.zoo: the paper's released models by name, through vit_plugin.get_model, mmpretrain's get_model,
list_models and inferencer, tools/infer.py NAME and tools/test.py NAME.

A toy entry stands for a released model: transformers' own ViTForImageClassification (width 32, 2 blocks,
patch 8, 32 px, 10 classes, random weights), saved by transformers into a prepared Hugging Face cache
(HF_HUB_OFFLINE=1) as ``google/vit-toy-zoo``, evaluated on the digits' test split. The real table is
checked where no weights are needed (names, filters, class names, the offline error)."""
import math
import os
import os.path as osp

import mmcv
import mmpretrain
import numpy as np
import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.registry import DefaultScope
from mmpretrain.apis import ImageClassificationInferencer, ModelHub
from mmpretrain.datasets.categories import IMAGENET_CATEGORIES
from mmpretrain.registry import DATASETS, MODELS
from transformers import ViTConfig, ViTForImageClassification

import vit_plugin
from helpers.hub_cache import hub_cache
from vit_plugin import zoo
from vit_plugin.checkpoint import CheckpointError
from vit_plugin.cli.infer import main as infer_main
from vit_plugin.cli.test import main as evaluate
from vit_plugin.compat.mmpretrain import dataset_meta

NAME = 'toy-vit-p8_orig_digits-32px'
REPO_ID = 'google/vit-toy-zoo'
ARCH = dict(embed_dims=32, num_layers=2, num_heads=4, mlp_dims=64)
CLASSES = [f'digit {i}' for i in range(10)]


@pytest.fixture(scope='module')
def toy(tmp_path_factory, digits_root):
    """The toy entry registered (and removed afterwards), its hub cache, and the transformers model."""
    tmp = tmp_path_factory.mktemp('zoo')
    torch.manual_seed(0)
    hf = ViTForImageClassification(ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8,
        num_labels=10, id2label=dict(enumerate(CLASSES)), label2id={n: i for i, n in enumerate(CLASSES)})).eval()
    hf.save_pretrained(tmp / 'repo')  # model.safetensors + config.json, as the google/vit-* repositories hold
    hub_cache(str(tmp / 'cache'), REPO_ID, str(tmp / 'repo'))
    env = pytest.MonkeyPatch()
    env.setenv('HF_HUB_OFFLINE', '1')
    env.setenv('HF_HUB_CACHE', str(tmp / 'cache'))
    entry = zoo.register_model(zoo.ReleasedModel(
        NAME, ARCH, 8, 32, 'hf-hub:' + REPO_ID, num_classes=10, aliases=('toy_vit_patch8_32.orig_digits', ),
        test_dataset=dict(type='vit_plugin.DigitsDataset', data_root=digits_root, split='test', num_classes=10)))
    yield entry, hf, tmp
    for key in [k for k, v in zoo._ALIASES.items() if v == NAME]:
        del zoo._ALIASES[key]
    del zoo.RELEASED[NAME]
    del ModelHub._models_dict[NAME]
    env.undo()


@pytest.fixture(scope='module')
def loaded(toy):
    """The toy model by name, and by a hand-written config whose init_cfg names the same hub id."""
    by_name = vit_plugin.get_model(NAME, pretrained=True)
    hand_written = dict(type='ImageClassifier', neck=None,
                        backbone=dict(type='vit_plugin.ViT', arch=ARCH, img_size=32, patch_size=8),
                        head=dict(type='VisionTransformerClsHead', num_classes=10, in_channels=32),
                        data_preprocessor=dict(num_classes=10, mean=[127.5] * 3, std=[127.5] * 3, to_rgb=True),
                        init_cfg=dict(type='Pretrained', checkpoint='hf-hub:' + REPO_ID))
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        by_hand = MODELS.build(hand_written)
    by_hand.init_weights()
    return by_name, by_hand.eval()


def digit_images(digits_root, n=4):
    folder = osp.join(digits_root, 'test')
    return [osp.join(folder, str(c), sorted(os.listdir(osp.join(folder, str(c))))[0]) for c in range(n)]


def scores(model, images):
    """Class scores of ``model`` for image files, through its data preprocessor (BGR uint8 in, 32 px)."""
    batch = dict(inputs=[torch.from_numpy(mmcv.imread(p)).permute(2, 0, 1).contiguous() for p in images])
    with torch.no_grad():
        return torch.stack([s.pred_score for s in model.test_step(batch)])


def test_a_name_gives_the_weights_and_outputs_of_a_hand_written_init_cfg(loaded, digits_root):
    by_name, by_hand = loaded
    ours, theirs = by_name.state_dict(), by_hand.state_dict()
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    images = digit_images(digits_root)
    assert torch.equal(scores(by_name, images), scores(by_hand, images))


def test_a_name_gives_transformers_own_logits(loaded, toy):
    _, hf, _ = toy
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (loaded[0](x, mode='tensor') - hf(x).logits).abs().max().item() < 1e-5


def test_a_name_names_the_classes_of_its_weights(loaded):
    assert list(dataset_meta(loaded[0])['classes']) == CLASSES  # the id2label of its config.json


def test_timm_names_and_hub_ids_name_the_same_model(toy):
    entry, _, _ = toy
    assert all(zoo.find_model(n) is entry for n in ('toy_vit_patch8_32.orig_digits', REPO_ID, 'hf-hub:' + REPO_ID,
                                                    NAME.upper()))
    assert zoo.find_model('vit_base_patch16_384.orig_in21k_ft_in1k').weights == 'hf-hub:google/vit-base-patch16-384'


def test_mmpretrain_get_model_loads_the_same_weights_by_name(loaded):
    theirs = mmpretrain.get_model(NAME, pretrained=True).state_dict()
    ours = loaded[0].state_dict()
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_mmpretrain_inferencer_runs_the_model_by_name(loaded, digits_root):
    images = digit_images(digits_root)
    # mmpretrain's inferencer builds its pipeline in whatever default scope is current; an earlier test's
    # runner in this worker may have left another toolkit's, which a user's fresh process does not have.
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        inferencer = ImageClassificationInferencer(NAME, device='cpu')
    results = inferencer(images)
    expected = scores(loaded[0], images)
    assert [r['pred_class'] for r in results] == [CLASSES[i] for i in expected.argmax(1).tolist()]
    np.testing.assert_allclose(np.stack([r['pred_scores'] for r in results]), expected.numpy(), atol=1e-6)


def test_infer_tool_names_the_top_classes_of_a_model_by_name(loaded, digits_root):
    images = digit_images(digits_root)
    results = infer_main([NAME, *images, '--topk', '3', '--device', 'cpu'])
    top = scores(loaded[0], images).topk(3)
    assert [[e['name'] for e in r['topk']] for r in results] == [[CLASSES[i] for i in row] for row in
                                                                 top.indices.tolist()]


def test_test_tool_evaluates_a_model_by_name_on_its_test_split(loaded, toy, tmp_path):
    entry, _, _ = toy
    metrics = evaluate([NAME, '--work-dir', str(tmp_path)])
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        dataset = DATASETS.build(entry.config().test_dataloader.dataset)
    right = 0
    with torch.no_grad():
        for start in range(0, len(dataset), 64):
            batch = pseudo_collate([dataset[i] for i in range(start, min(start + 64, len(dataset)))])
            right += sum(int(s.pred_label.item() == s.gt_label.item()) for s in loaded[0].test_step(batch))
    assert len(dataset) == 359 and metrics['accuracy/top1'] == pytest.approx(100 * right / len(dataset), abs=1e-4)


# The released models of the paper, written out by hand: ImageNet-21k pre-training of B/16, B/32, R50+B/16,
# L/16, L/32 and H/14, and the ImageNet-1k fine-tunes of B/16 (224 and 384), B/32, R50+B/16, L/16 (224 and
# 384) and L/32.
PRETRAINED_IN21K = ['vit-base-p16_orig_in21k', 'vit-base-p32_orig_in21k', 'vit-base-r50-s16_orig_in21k',
                    'vit-huge-p14_orig_in21k', 'vit-large-p16_orig_in21k', 'vit-large-p32_orig_in21k']
FINE_TUNED_IN1K = ['vit-base-p16_in21k-pre_orig_in1k', 'vit-base-p16_in21k-pre_orig_in1k-384px',
                   'vit-base-p32_in21k-pre_orig_in1k-384px', 'vit-base-r50-s16_in21k-pre_orig_in1k-384px',
                   'vit-large-p16_in21k-pre_orig_in1k', 'vit-large-p16_in21k-pre_orig_in1k-384px',
                   'vit-large-p32_in21k-pre_orig_in1k-384px']


def test_list_models_filters_by_pattern_exclusion_and_task():
    assert zoo.list_models('vit-large') == [
        'vit-large-p16_in21k-pre_orig_in1k', 'vit-large-p16_in21k-pre_orig_in1k-384px', 'vit-large-p16_orig_in21k',
        'vit-large-p32_in21k-pre_orig_in1k-384px', 'vit-large-p32_orig_in21k']
    assert zoo.list_models('*in21k*', exclude_patterns=['*in1k*']) == PRETRAINED_IN21K
    assert zoo.list_models('vit*', task='Image Classification') == FINE_TUNED_IN1K
    # a timm name selects its model too
    assert zoo.list_models('vit_base_patch16*') == [
        'vit-base-p16_in21k-pre_orig_in1k', 'vit-base-p16_in21k-pre_orig_in1k-384px', 'vit-base-p16_orig_in21k']


def test_mmpretrain_lists_our_names_beside_its_own():
    ours = zoo.list_models('vit-*orig*', task='Image Classification')
    assert mmpretrain.list_models('vit-*orig*', task='Image Classification') == ours and len(ours) >= 7
    assert 'vit-base-p16_in21k-pre_3rdparty_in1k-384px' in mmpretrain.list_models('vit-base')


def test_an_unknown_name_gets_the_closest_names():
    with pytest.raises(zoo.UnknownModelError) as err:
        vit_plugin.get_model('vit-base-p16_in21k-pre_orig_in1k-385px')
    message = str(err.value)
    lines = sum(max(1, math.ceil(len(line) / 100)) for line in message.split('\n'))  # in a 100-column terminal
    assert 'closest: vit-base-p16_in21k-pre_orig_in1k-384px' in message and lines <= 3


def test_an_imagenet_classifier_names_the_1000_classes_without_weights():
    model = vit_plugin.get_model('vit-base-p32_in21k-pre_orig_in1k-384px')
    assert list(dataset_meta(model)['classes']) == list(IMAGENET_CATEGORIES) and model.head.num_classes == 1000


def test_weights_not_in_the_cache_offline_name_the_repository_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'empty'))
    with pytest.raises(CheckpointError, match='huggingface-cli download google/vit-large-patch16-384'):
        vit_plugin.get_model('vit-large-p16_in21k-pre_orig_in1k-384px', pretrained=True)
