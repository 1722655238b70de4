"""MPP beside mmpretrain's MAE and MaskFeat: their encoders convert to our ViT with equal outputs, every
method pre-trains the same encoder, every arm fine-tunes with the same config, and the one-command
comparison runs end to end at a toy budget (on 16 training and 5 test images per class)."""
import copy
import functools
import json
import os.path as osp
import subprocess
import sys

import pytest
import torch
from helpers.common import REPO, run_env
from helpers.mpp_study_data import digits_subset
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmpretrain.models.selfsup import HOGGenerator
from mmpretrain.registry import MODELS

import vit_plugin  # noqa: F401  (registers the vit_plugin scope)
from vit_plugin.converters import ConversionError, detect_torch_format, mmpretrain_mim_to_vit
from vit_plugin.converters.convert_file import convert_checkpoint_file
from vit_plugin.models.selfsup import PatchHOGGenerator

PROJECT = osp.join(REPO, 'projects', 'masked_patch_prediction')
CONFIGS = osp.join(PROJECT, 'configs')
PRETRAIN_CONFIGS = {'mpp': 'mpp_tiny-vit_digits.py', 'mae': 'mae_tiny-vit_digits.py',
                    'maskfeat': 'maskfeat_tiny-vit_digits.py'}


@functools.lru_cache(maxsize=None)
def _config(name):
    """A config of configs/, read once per test file (callers get a copy)."""
    return Config.fromfile(osp.join(CONFIGS, name))


def _build(config, seed=0):
    """A pre-training model of the project at its initial weights, in eval mode."""
    init_default_scope('mmpretrain')
    torch.manual_seed(seed)
    model = MODELS.build(copy.deepcopy(_config(config).model))
    model.init_weights()
    model.eval()
    return model


def _tiny_vit(state=None):
    """The study's ViT (configs/_tiny_vit.py), loaded strictly with ``state`` (backbone-relative keys)."""
    init_default_scope('mmpretrain')
    vit = MODELS.build(copy.deepcopy(_config('_tiny_vit.py').backbone))
    if state is not None:
        vit.load_state_dict(state, strict=True)
    vit.eval()
    return vit


def _study():
    from projects.masked_patch_prediction import study
    return study


def test_mae_encoder_converts_to_our_vit_with_equal_tokens():
    mae = _build('mae_tiny-vit_digits.py')
    state, report = mmpretrain_mim_to_vit(mae.state_dict(), backbone_prefix='')
    report.check()
    assert any(k.startswith('neck.decoder_blocks.') for k in report.dropped) and 'neck.mask_token' in report.dropped
    assert "MAE's fixed 2D sin-cos table" in report.notes[0]
    ours = _tiny_vit(state)
    assert ours.pos_embed.requires_grad and not mae.backbone.pos_embed.requires_grad
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = ours.forward_features(x)
        # mask=None is MAE's full-sequence path (MAE.extract_feat); mask=False would still mask.
        reference = mae.backbone(x, mask=None)[0]
        torch.testing.assert_close(tokens[:, 1:], reference[:, 1:], atol=1e-5, rtol=0)
        torch.testing.assert_close(tokens[:, 0], reference[:, 0], atol=1e-5, rtol=0)
        # The pre-training path (position added before the class token is prepended, tokens shuffled)
        # at mask ratio 0 gives the same patch tokens once put back in order.
        mae.backbone.mask_ratio = 0.
        latent, mask, ids_restore = mae.backbone(x)
        assert mask.sum() == 0 and latent.shape == (2, 65, 64)
        patches = torch.gather(latent[:, 1:], 1, ids_restore[..., None].expand(-1, -1, 64))
        torch.testing.assert_close(tokens[:, 1:], patches, atol=1e-5, rtol=0)


def test_maskfeat_encoder_converts_to_our_vit_with_equal_tokens():
    maskfeat = _build('maskfeat_tiny-vit_digits.py')
    state, report = mmpretrain_mim_to_vit(maskfeat.state_dict(), backbone_prefix='')
    report.check()
    assert {'backbone.mask_token', 'neck.fc.weight', 'target_generator.weight_x'} <= set(report.dropped)
    ours = _tiny_vit(state)
    x = torch.randn(2, 3, 32, 32)
    nothing_masked = torch.zeros(2, 64, dtype=torch.bool)
    with torch.no_grad():
        tokens = ours.forward_features(x)
        torch.testing.assert_close(tokens[:, 1:], maskfeat.backbone(x, nothing_masked)[:, 1:], atol=1e-5, rtol=0)
        torch.testing.assert_close(tokens, maskfeat.backbone(x, None)[0], atol=1e-5, rtol=0)
        some_masked = nothing_masked.clone()
        some_masked[:, :8] = True  # the mask token is used: the masked patches' tokens change
        assert (tokens[:, 1:9] - maskfeat.backbone(x, some_masked)[:, 1:9]).abs().max() > 1e-3


def test_training_checkpoints_convert_to_files_that_init_cfg_loads(tmp_path):
    """A runner-style MAE / MaskFeat checkpoint is recognised, converted atomically to our layout and
    loaded by ``init_cfg=dict(type='Pretrained', prefix='backbone.')`` into the study's ViT."""
    x = torch.randn(2, 3, 32, 32)
    for name in ('mae', 'maskfeat'):
        model = _build(PRETRAIN_CONFIGS[name], seed=1)
        src, dst = tmp_path / f'{name}_iter_4.pth', tmp_path / f'{name}_encoder.pth'
        torch.save(dict(meta=dict(iter=4), state_dict=model.state_dict()), src)
        assert detect_torch_format(model.state_dict()) == 'mmpretrain_mim'
        report, _ = convert_checkpoint_file(str(src), str(dst), show_progress=False)  # format detected
        assert report.notes and any(k.startswith('neck.') for k in report.dropped)
        init_default_scope('mmpretrain')
        cfg = copy.deepcopy(_config('_tiny_vit.py').backbone)
        cfg.init_cfg = dict(type='Pretrained', checkpoint=str(dst), prefix='backbone.')
        vit = MODELS.build(cfg)
        vit.init_weights()
        vit.eval()
        with torch.no_grad():
            reference = model.backbone(x, None)[0]
            torch.testing.assert_close(vit.forward_features(x), reference, atol=1e-5, rtol=0)
    # Classifiers keep their own format (their heads are kept, not dropped as pre-training parts).
    classifier = {'backbone.layers.0.ln1.weight': torch.ones(2), 'neck.fc.weight': torch.ones(2, 2),
                  'head.fc.weight': torch.ones(3, 2)}
    assert detect_torch_format(classifier) == 'mmpretrain'
    with pytest.raises(ConversionError, match='unknown'):
        convert_checkpoint_file(str(tmp_path / 'mae_iter_4.pth'), str(tmp_path / 'x.pth'), src_format='mmpretrain',
                                show_progress=False)
    assert not osp.exists(tmp_path / 'x.pth')


def test_patch_hog_equals_mmpretrain_at_its_size_and_fits_the_digits_grid():
    torch.manual_seed(0)
    image = torch.randn(1, 3, 224, 224)
    torch.testing.assert_close(PatchHOGGenerator(patch_size=16, nbins=9, pool=8, gaussian_window=16)(image),
                               HOGGenerator(nbins=9, pool=8, gaussian_window=16)(image), atol=0, rtol=0)
    digits = torch.randn(2, 3, 32, 32)
    hog = PatchHOGGenerator(patch_size=4, nbins=9, pool=2, gaussian_window=4)
    assert hog(digits).shape == (2, 64, 108)  # 8x8 patches, 3 channels x 9 bins x 2x2 cells
    # mmpretrain's own generator assumes a 14x14 patch grid: at 32 px it returns another grid.
    assert HOGGenerator(nbins=9, pool=2, gaussian_window=4)(digits).shape[1] != 64
    # each patch's target describes that patch: changing one patch changes only its own and its
    # neighbours' targets (the 3x3 gradient reaches one pixel into them)
    changed = digits.clone()
    changed[:, :, 12:16, 12:16] += 1 + torch.rand(2, 3, 4, 4)
    moved = (hog(changed) - hog(digits)).abs().amax(dim=(0, 2)).reshape(8, 8) > 1e-6
    assert moved[3, 3] and moved.sum() <= 9 and not moved[:2].any() and not moved[:, 5:].any()
    with pytest.raises(ValueError, match='must divide patch_size'):
        PatchHOGGenerator(patch_size=4, pool=3)


def test_every_method_pretrains_the_same_encoder():
    """Parameters outside each method's own parts (decoder, mask token, head) are the study's ViT's."""
    vit = _tiny_vit()
    encoder = sum(p.numel() for p in vit.parameters())
    specific = {'mpp': ('mask_token', 'head.'), 'mae': ('neck.', ), 'maskfeat': ('backbone.mask_token', 'neck.')}
    for name, config in PRETRAIN_CONFIGS.items():
        model = _build(config)
        own = {n: p.numel() for n, p in model.named_parameters() if n.startswith(specific[name])}
        rest = {n: p.numel() for n, p in model.named_parameters() if not n.startswith(specific[name])}
        assert all(n.startswith('backbone.') for n in rest), name
        assert sum(rest.values()) == encoder, (name, sum(rest.values()), encoder)
        assert own, name
        grid = model.backbone.patch_grid if name == 'mpp' else model.backbone.patch_resolution
        assert tuple(grid) == (8, 8), name
    mae = _build(PRETRAIN_CONFIGS['mae'])
    assert mae.backbone.mask_ratio == 0.75 and mae.head.norm_pix
    assert len(mae.neck.decoder_blocks) == 2 and mae.neck.decoder_embed.out_features == 64
    init_default_scope('mmpretrain')
    classifier = MODELS.build(copy.deepcopy(_config('tiny-vit_digits_ft-mpp.py').model))
    assert sum(p.numel() for p in classifier.backbone.parameters()) == encoder


def test_every_arm_finetunes_with_one_config_but_its_init(tmp_path):
    study = _study()

    def config(checkpoint):
        cfg = study.finetune_config(str(tmp_path), 300, 1, 5, checkpoint).to_dict()
        init = cfg['model']['backbone'].pop('init_cfg', None)
        return cfg, init

    scratch, none = config(None)
    assert none is None
    for arm in ('mpp', 'mae', 'maskfeat'):
        cfg, init = config(f'work_dirs/{arm}/encoder.pth')
        assert init == dict(type='Pretrained', prefix='backbone.', checkpoint=f'work_dirs/{arm}/encoder.pth')
        assert cfg == scratch, arm


@pytest.mark.slow
def test_comparison_runs_every_arm_at_toy_budget(tmp_path, digits_root):
    work = tmp_path / 'comparison'
    data = digits_subset(digits_root, str(tmp_path / 'digits'), train_per_class=16, test_per_class=5)
    proc = subprocess.run([sys.executable, osp.join(PROJECT, 'compare_mim.py'), '--budget', 'tiny',
                           '--work-dir', str(work), '--data-root', data],
                          env=run_env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert osp.getsize(work / 'comparison.png') > 1000
    text = (work / 'comparison.json').read_text()
    assert REPO not in text  # nothing of this machine's layout in a shared results file
    results = json.loads(text)
    arms = ['scratch', 'scratch_matched', 'mpp', 'mae', 'maskfeat']
    eff = results['label_efficiency']
    assert list(eff) == arms and all(list(eff[a]['top1']) == ['1', 'all'] for a in arms)
    assert eff['scratch']['iters'] == eff['mae']['iters'] == 3 and eff['scratch_matched']['iters'] == 4 + 3
    assert all(0 <= v['mean'] <= 100 for a in arms for v in eff[a]['top1'].values())
    assert set(results['fewshot']) == {'random_init', 'mpp', 'mae', 'maskfeat'}
    assert all(list(p) == ['1', '2'] for p in results['fewshot'].values())
    for name in ('mpp', 'mae', 'maskfeat'):
        run = results['pretraining']['methods'][name]['runs'][0]
        assert len(run['loss']) == 4 and run['images'] == 4 * 64 and run['seconds'] > 0
        assert (name == 'mpp') == (run['conversion'] is None)
    assert 'backbone.mask_token' in results['pretraining']['methods']['maskfeat']['runs'][0]['conversion']['dropped']
    cost = results['cost']
    assert cost['scratch']['pretrain_images'] == 0 and cost['scratch']['finetune_images'] == 3 * 64
    assert cost['scratch_matched']['images_per_label_count'] == cost['mae']['images_per_label_count'] == 7 * 64
    assert all(cost[a]['total_seconds'] > 0 for a in arms)
    for row in ('scratch, matched compute', 'MPP', 'MAE', 'MaskFeat', 'probe 1-shot', 'ft all/class'):
        assert row in proc.stdout, row
