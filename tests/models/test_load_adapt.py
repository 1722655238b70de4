"""A checkpoint trained at one resolution loads into a model at another through every loading path of a
real mmengine Runner (init_cfg Pretrained, load_from, resume) and plain load_state_dict, with the
position embedding resized exactly once (counted log lines), and official .npz files load directly, also
through the README's fine-tuning recipe, with the GELU they were trained with.

The backbone's load-time adaptation itself (``vit_plugin.models.load_adapt``): one resize with the mode
recorded, non-square grids, a patch-size change, the backbone part of a whole model, and clear errors for
another model, several ViTs and a class-token mismatch."""
import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import mmcv  # noqa: F401  (pinned; mmpretrain's ImageClassifier needs it: a missing mmcv fails here)
from mmengine.runner import Runner  # noqa: E402
from scipy import ndimage  # noqa: E402

import vit_plugin  # noqa: E402,F401  (what custom_imports=['vit_plugin'] does in a config)
from helpers.common import REPO  # noqa: E402
from helpers.official_npz import official_arrays, save_npz  # noqa: E402
from vit_plugin.checkpoint.records import MODE_KEY, encode_resize_mode  # noqa: E402
from vit_plugin.cli.convert_checkpoint import main as convert_main  # noqa: E402
from vit_plugin.engine.hooks import pos_embed_hooks  # noqa: E402
from vit_plugin.models import ViT, load_adapt, numerics  # noqa: E402
from vit_plugin.models.patch_resize import resize_patch_embed  # noqa: E402
from vit_plugin.models.pos_embed import resize_pos_embed  # noqa: E402

TINY = dict(embed_dims=32, num_layers=2, num_heads=4, mlp_dims=64)
RESIZED = 'Resized position embedding'


class TinyImages(Dataset):
    """Four random images of ``size`` px with labels, in mmpretrain's data format."""

    def __init__(self, size):
        from mmpretrain.structures import DataSample
        g = torch.Generator().manual_seed(0)
        self.items = [dict(inputs=torch.randint(0, 256, (3, size, size), generator=g, dtype=torch.uint8),
                           data_samples=DataSample().set_gt_label(i % 3)) for i in range(4)]
        self.metainfo = dict(classes=('a', 'b', 'c'))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


@pytest.fixture
def resize_logs(monkeypatch):
    """Every message the loading code (backbone pre-hooks and runner hook) logs."""
    lines = []
    for module in (load_adapt, numerics, pos_embed_hooks):
        def record(msg, *args, _original=module.print_log, **kwargs):
            lines.append(msg)
            return _original(msg, *args, **kwargs)
        monkeypatch.setattr(module, 'print_log', record)
    return lines


def _model(size, init_cfg=None, **backbone):
    return dict(type='ImageClassifier',
                backbone=dict(type='vit_plugin.ViT', arch=TINY, img_size=size, patch_size=8, init_cfg=init_cfg,
                              **backbone),
                neck=None,
                head=dict(type='VisionTransformerClsHead', num_classes=3, in_channels=32,
                          loss=dict(type='CrossEntropyLoss')),
                data_preprocessor=dict(type='ClsDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3, num_classes=3))


def _runner(work_dir, name, size, iters=1, lr=0., **kwargs):
    # lr=0 keeps the loaded weights unchanged through the training step, so they can be compared.
    return Runner(
        model=kwargs.pop('model', _model(size)), work_dir=str(work_dir / name), experiment_name=name,
        train_dataloader=dict(dataset=TinyImages(size), sampler=dict(type='DefaultSampler', shuffle=False),
                              batch_size=2, num_workers=0),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=lr, weight_decay=0.)),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1, by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1)),
        default_scope='mmpretrain',
        randomness=dict(seed=0), log_level='WARNING', **kwargs)


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
    """A 32-px (4x4 grid) runner checkpoint with optimizer state: the '224-px' checkpoint."""
    work_dir = tmp_path_factory.mktemp('pretrain')
    runner = _runner(work_dir, 'pretrain', 32, iters=1, lr=1e-3)
    runner.train()
    path = str(work_dir / 'pretrain' / 'iter_1.pth')
    state = torch.load(path, weights_only=False)['state_dict']
    return path, state


def _expected(state, mode='official'):  # the rule for checkpoints that record no mode (ours)
    return resize_pos_embed(state['backbone.pos_embed'], (6, 6), (4, 4), 1, mode=mode, compute_dtype=torch.float64)


def _pos_embed(runner):
    return runner.model.backbone.pos_embed.detach().cpu()


def test_init_cfg_pretrained(tmp_path, pretrained, resize_logs):
    path, state = pretrained
    init_cfg = dict(type='Pretrained', checkpoint=path, prefix='backbone.')
    runner = _runner(tmp_path, 'init_cfg', 48, model=_model(48, init_cfg=init_cfg))
    runner.train()
    assert sum(RESIZED in line for line in resize_logs) == 1
    assert torch.equal(_pos_embed(runner), _expected(state))


@pytest.mark.parametrize('with_hook', [False, True])
def test_load_from(tmp_path, pretrained, resize_logs, with_hook):
    path, state = pretrained
    hooks = [dict(type='vit_plugin.PosEmbedResizeHook')] if with_hook else None
    runner = _runner(tmp_path, f'load_from{with_hook}', 48, load_from=path, custom_hooks=hooks)
    runner.train()
    assert sum(RESIZED in line for line in resize_logs) == 1
    assert torch.equal(_pos_embed(runner), _expected(state))


def test_resume_resets_optimizer_state_of_resized_tensors(tmp_path, pretrained, resize_logs):
    path, state = pretrained
    runner = _runner(tmp_path, 'resume', 48, iters=2, lr=1e-3, load_from=path, resume=True,
                     custom_hooks=[dict(type='vit_plugin.PosEmbedResizeHook')])
    runner.train()  # continues at iteration 1 with Adam state for every tensor except pos_embed
    assert runner.iter == 2
    assert sum(RESIZED in line for line in resize_logs) == 1
    assert sum('reset the optimizer state of "backbone.pos_embed"' in line for line in resize_logs) == 1
    optimizer = runner.optim_wrapper.optimizer
    assert optimizer.state[runner.model.backbone.pos_embed]['step'].item() == 1  # fresh state, one step
    assert optimizer.state[runner.model.backbone.cls_token]['step'].item() == 2  # resumed state


def test_plain_load_state_dict(pretrained, resize_logs):
    from mmpretrain.registry import MODELS
    _, state = pretrained
    model = MODELS.build(_model(48))
    model.load_state_dict(state, strict=True)
    assert sum(RESIZED in line for line in resize_logs) == 1
    assert torch.equal(model.backbone.pos_embed.detach(), _expected(state))


def test_official_npz_through_load_from_and_init_cfg(tmp_path, resize_logs):
    arrays = official_arrays(classes=3)
    npz = save_npz(tmp_path / 'ViT-tiny.npz', arrays)
    table = arrays['Transformer/posembed_input/pos_embedding'][0, 1:].reshape(4, 4, 32)
    ref = ndimage.zoom(table, (1.5, 1.5, 1), order=1)  # what the official loader does
    model = _model(48, gelu_approximate='tanh')
    runner = _runner(tmp_path, 'npz_load_from', 48, model=model, load_from=npz)
    runner.train()
    np.testing.assert_allclose(_pos_embed(runner)[0, 1:].reshape(6, 6, 32).numpy(), ref, atol=1e-6)
    head = runner.model.head.layers.head.weight.detach()
    assert torch.equal(head, torch.from_numpy(arrays['head/kernel'].T.copy()))
    init_cfg = dict(type='Pretrained', checkpoint=npz, prefix='backbone.')
    runner = _runner(tmp_path, 'npz_init_cfg', 48, model=_model(48, init_cfg=init_cfg, gelu_approximate='tanh'))
    runner.train()
    np.testing.assert_allclose(_pos_embed(runner)[0, 1:].reshape(6, 6, 32).numpy(), ref, atol=1e-6)
    assert sum(RESIZED in line and 'mode=official' in line for line in resize_logs) == 2  # once per path


# ----------------------------------------------------------------------------- the README's recipe
def _readme_snippet(heading):
    """The first python block after ``heading`` in README.md, as a user copies it."""
    import os.path as osp
    import re
    text = open(osp.join(REPO, 'README.md')).read()
    start = text.index(heading)
    return re.search(r'```python\n(.*?)```', text[start:], re.S).group(1)


@pytest.fixture(scope='module')
def official_files(tmp_path_factory):
    """A tiny official-layout .npz (4x4 grid, pre-training head) and its conversion by the tool."""
    folder = tmp_path_factory.mktemp('official')
    arrays = official_arrays(pre_logits=24, classes=7)
    npz = save_npz(folder / 'ViT-B_16.npz', arrays)
    assert convert_main([npz, str(folder / 'ViT-B_16.pth')]) == 0
    return arrays, {'npz': npz, 'converted': str(folder / 'ViT-B_16.pth')}


@pytest.mark.parametrize('source', ['npz', 'converted'])
def test_readme_finetuning_recipe_for_official_weights(tmp_path, official_files, resize_logs, source):
    """'A new experiment is a few lines': the README's snippet, as written (prefix=None), fine-tunes
    from an official .npz or its conversion: the backbone gets the official weights, resized as the
    official loader does; the config declares the official numerics (tanh GELU, inputs in [-1, 1]), so
    loading changes none of them (nothing logged); the new head starts at zero."""
    import os.path as osp

    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    arrays, files = official_files
    snippet = _readme_snippet('A new experiment is a few lines')
    assert "prefix=None" in snippet and "'./vit_b16_in21k_ft_cifar10_384.py'" in snippet
    snippet = snippet.replace("'./vit_b16_in21k_ft_cifar10_384.py'",
                              repr(osp.join(REPO, 'configs', 'vit_b16_in21k_ft_cifar10_384.py')))
    snippet = snippet.replace("'checkpoints/ViT-B_16.npz'", repr(files[source]))
    (tmp_path / 'experiment.py').write_text(snippet)
    cfg = Config.fromfile(str(tmp_path / 'experiment.py'))
    assert cfg.model.backbone.init_cfg.prefix is None
    cfg.model.backbone.update(arch=TINY, patch_size=8, img_size=48)  # the tiny file's model, at 48 px
    cfg.model.head.in_channels = TINY['embed_dims']
    init_default_scope('mmpretrain')
    model = MODELS.build(cfg.model)
    assert {m.approximate for m in model.backbone.modules() if isinstance(m, torch.nn.GELU)} == {'tanh'}
    declared = model.backbone.expected_input_norm
    assert declared == ((127.5, ) * 3, (127.5, ) * 3)
    model.init_weights()

    backbone = model.backbone
    table = arrays['Transformer/posembed_input/pos_embedding'][0, 1:].reshape(4, 4, 32)
    ref = ndimage.zoom(table, (1.5, 1.5, 1), order=1)  # what the official loader does
    np.testing.assert_allclose(backbone.pos_embed.detach()[0, 1:].reshape(6, 6, 32).numpy(), ref, atol=1e-6)
    kernel = arrays['Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel']
    assert torch.equal(backbone.blocks[1].mlp.fc1.weight.detach(), torch.from_numpy(kernel.T.copy()))
    assert torch.equal(backbone.cls_token.detach().reshape(-1), torch.from_numpy(arrays['cls'].reshape(-1)))
    assert {m.approximate for m in backbone.modules() if isinstance(m, torch.nn.GELU)} == {'tanh'}
    assert {m.eps for m in backbone.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-6}
    assert backbone.expected_input_norm == declared
    assert not [line for line in resize_logs if 'checkpoint_numerics' in line or 'input normalisation' in line]
    assert model.head.layers.head.weight.shape == (10, 32) and not model.head.layers.head.weight.any()
    assert sum('loading its "backbone." part' in line for line in resize_logs) == 1
    assert sum(RESIZED in line and 'mode=official' in line for line in resize_logs) == 1


def test_official_npz_load_from_runs_the_tanh_gelu_and_keeps_it(tmp_path):
    """load_from an official .npz into a classifier whose config says exact GELU: training runs tanh,
    and the runner's checkpoint carries it to the next load (tools/test.py builds the same config)."""
    from mmpretrain.registry import MODELS
    npz = save_npz(tmp_path / 'ViT-tiny.npz', official_arrays(classes=3))
    runner = _runner(tmp_path, 'npz_gelu', 32, load_from=npz)
    runner.train()
    gelus = {m.approximate for m in runner.model.backbone.modules() if isinstance(m, torch.nn.GELU)}
    assert gelus == {'tanh'}
    saved = torch.load(str(tmp_path / 'npz_gelu' / 'iter_1.pth'), weights_only=False)['state_dict']
    fresh = MODELS.build(_model(32))
    fresh.load_state_dict(saved, strict=True)
    assert {m.approximate for m in fresh.backbone.modules() if isinstance(m, torch.nn.GELU)} == {'tanh'}


# ----------------------------------------------------------------------------- numerics records
def _official_state(official_files):
    """The tool's conversion of the tiny official .npz (records: tanh GELU, inputs in [-1, 1])."""
    return torch.load(official_files[1]['converted'], weights_only=False)['state_dict']


def _gelus(model):
    return {m.approximate for m in model.modules() if isinstance(m, torch.nn.GELU)}


def test_error_setting_refuses_official_weights_into_a_config_that_pins_other_numerics(official_files):
    model = ViT(arch=TINY, img_size=32, patch_size=8, checkpoint_numerics='error',
                expected_input_norm=dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]))
    with pytest.raises(ValueError, match=r"checkpoint_numerics='error'") as err:
        model.load_state_dict(_official_state(official_files))
    message = str(err.value)
    assert "gelu_approximate: config 'none', checkpoint 'tanh'" in message and 'expected_input_norm' in message
    assert "checkpoint_numerics='from_checkpoint'" in message and "'keep'" in message
    assert _gelus(model) == {'none'}  # refused before anything changed
    # the same weights into a config that declares their numerics load under 'error' as well
    official = ViT(arch=TINY, img_size=32, patch_size=8, checkpoint_numerics='error', gelu_approximate='tanh',
                   expected_input_norm=dict(mean=[127.5] * 3, std=[127.5] * 3))
    official.load_state_dict(_official_state(official_files))
    with pytest.raises(ValueError, match='checkpoint_numerics must be one of'):
        ViT(arch=TINY, checkpoint_numerics='ignore')


def test_keep_setting_leaves_the_models_numerics_and_says_so_once(official_files, resize_logs):
    model = ViT(arch=TINY, img_size=32, patch_size=8, checkpoint_numerics='keep')
    model.load_state_dict(_official_state(official_files))
    assert _gelus(model) == {'none'} and model.expected_input_norm is None
    (line, ) = [line for line in resize_logs if 'checkpoint_numerics' in line]
    assert "checkpoint_numerics='keep'" in line and "GELU approximate 'none' (checkpoint: 'tanh')" in line
    saved = model.state_dict()  # what the model runs is what it saves
    assert 'gelu_approximate' not in saved and 'input_normalization' not in saved


def test_from_checkpoint_setting_applies_the_records_with_one_line_naming_the_keyword(official_files,
                                                                                       resize_logs):
    model = ViT(arch=TINY, img_size=32, patch_size=8)  # checkpoint_numerics='from_checkpoint', the default
    model.load_state_dict(_official_state(official_files))
    assert _gelus(model) == {'tanh'} and model.expected_input_norm == ((127.5, ) * 3, (127.5, ) * 3)
    (line, ) = [line for line in resize_logs if 'GELU' in line]
    assert line == ("ViT: GELU approximate 'none' -> 'tanh' from the checkpoint's record (gelu_approximate; "
                    "checkpoint_numerics='keep' pins the config's gelu_approximate)")
    # a LayerNorm eps record (transformers' ports: 1e-12) is applied the same way, and saved again
    state = model.state_dict()
    state['layer_norm_eps'] = torch.tensor(1e-12, dtype=torch.float64)
    model.load_state_dict(state)
    assert {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-12}
    assert sum("LayerNorm eps 1e-06 -> 1e-12" in line and 'norm_eps' in line for line in resize_logs) == 1
    assert float(model.state_dict()['layer_norm_eps']) == 1e-12


# ----------------------------------------------------------------------------- load-time adaptation
class _LogCounter:
    def __init__(self, monkeypatch):
        self.lines = []
        original = load_adapt.print_log

        def record(msg, *args, **kwargs):
            self.lines.append(msg)
            return original(msg, *args, **kwargs)
        monkeypatch.setattr(load_adapt, 'print_log', record)

    def count(self, text):
        return sum(text in line for line in self.lines)


def _vit(img_size=32, patch_size=8, **kwargs):
    torch.manual_seed(0)
    model = ViT(arch=TINY, img_size=img_size, patch_size=patch_size, **kwargs)
    model.init_weights()
    return model.eval()


def test_plain_load_state_dict_resizes_once_with_official_mode_recorded(monkeypatch):
    logs = _LogCounter(monkeypatch)
    src, dst = _vit(32), _vit(48)
    state = src.state_dict()
    state[MODE_KEY] = encode_resize_mode('official')
    assert dst.load_state_dict(state, strict=True)  # the mode key is consumed, not unexpected
    expected = resize_pos_embed(src.pos_embed.detach(), (6, 6), (4, 4), mode='official',
                                compute_dtype=torch.float64)
    assert torch.equal(dst.pos_embed.detach(), expected)
    assert logs.count('Resized position embedding') == 1 and 'mode=official' in logs.lines[0]
    assert dst.pos_embed_grid.tolist() == [6, 6]


def test_non_square_grid_travels_with_our_weights(monkeypatch):
    src, dst = _vit((32, 48)), _vit((48, 32))
    dst.load_state_dict(src.state_dict())  # a 4x6 table that cannot be inferred without metadata
    expected = resize_pos_embed(src.pos_embed.detach(), (6, 4), (4, 6), mode='official',
                                compute_dtype=torch.float64)
    assert torch.equal(dst.pos_embed.detach(), expected)
    state = _vit((32, 56)).state_dict()
    del state['pos_embed_grid']  # third-party weights: 28 patch entries could be 4x7, 7x4, 2x14 ...
    with pytest.raises(ValueError, match=r'pos_embed: cannot infer the patch grid.*pos_embed_grid=\(rows, cols\)'):
        dst.load_state_dict(state)


def test_patch_size_change_resizes_kernel_and_grid(monkeypatch):
    logs = _LogCounter(monkeypatch)
    src, dst = _vit(32, 8), _vit(32, 4)
    dst.load_state_dict(src.state_dict())
    torch.testing.assert_close(dst.patch_embed.proj.weight.detach(),
                               resize_patch_embed(src.patch_embed.proj.weight.detach(), 4))
    assert logs.count('Resized patch-embedding kernel') == 1 and logs.count('Resized position embedding') == 1
    assert tuple(dst.pos_embed.shape) == (1, 65, 32)


def test_wrong_model_fails_clearly():
    dst = _vit(32)
    wide = ViT(arch=dict(TINY, embed_dims=48, num_heads=4, mlp_dims=96), img_size=32, patch_size=8)
    with pytest.raises(ValueError, match='pos_embed: the checkpoint has width 48.*embed_dims=32'):
        dst.load_state_dict(wide.state_dict(), strict=False)
    deep = ViT(arch=dict(TINY, num_layers=3), img_size=32, patch_size=8)
    with pytest.raises(ValueError, match='blocks.2: the checkpoint has 3 encoder blocks'):
        dst.load_state_dict(deep.state_dict(), strict=False)


def test_bare_backbone_takes_the_backbone_part_of_a_whole_model(monkeypatch):
    logs = _LogCounter(monkeypatch)
    src, dst = _vit(32), ViT(arch=TINY, img_size=32, patch_size=8)
    whole = {**{'backbone.' + k: v for k, v in src.state_dict().items()},
             'head.layers.head.weight': torch.randn(5, 32), 'head.layers.head.bias': torch.randn(5)}
    dst.load_state_dict(whole, strict=True)  # the head is left out, so nothing is unexpected
    for key, value in src.state_dict().items():
        assert torch.equal(dst.state_dict()[key], value), key
    assert logs.count('loading its "backbone." part') == 1
    assert 'head.layers.head.weight' in logs.lines[0]


def test_whole_model_with_several_vits_is_refused():
    state = _vit(32).state_dict()
    both = {**{'backbone.' + k: v for k, v in state.items()}, **{'teacher.backbone.' + k: v for k, v in state.items()}}
    with pytest.raises(ValueError, match=r"'backbone.', 'teacher.backbone.'.*ambiguous.*prefix='backbone.'"):
        _vit(32).load_state_dict(both, strict=False)
    other = {'encoder.' + k: v for k, v in state.items()}  # a ViT under another name is not guessed at
    with pytest.raises(ValueError, match="'encoder.'.*prefix='encoder.'"):
        _vit(32).load_state_dict(other, strict=False)


def test_class_token_mismatch_is_explained():
    gap = _vit(32, with_cls_token=False, out_type='gap')
    with pytest.raises(ValueError, match='with_cls_token=True'):
        gap.load_state_dict(_vit(48).state_dict())
    with pytest.raises(ValueError, match='with_cls_token=False'):
        _vit(48).load_state_dict(gap.state_dict())
