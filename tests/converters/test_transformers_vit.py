"""The paper's weights as the Hugging Face hub ships them: safetensors files, the ``transformers`` layout
(``google/vit-*``) with its config.json, timm's layout, model folders and ``hf-hub:`` ids read from a
local hub cache with HF_HUB_OFFLINE=1. Every model is built with the real library at random weights,
saved with that library's own writer, loaded through our paths and compared with the library's outputs."""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
import timm
import torch
import transformers
from mmengine.registry import DefaultScope
from mmengine.runner.checkpoint import CheckpointLoader, load_checkpoint
from PIL import Image
from safetensors.torch import save_file
from transformers import ViTConfig, ViTForImageClassification, ViTModel

import vit_plugin  # noqa: F401  (registers the loaders, as custom_imports=['vit_plugin'] does)
from helpers.common import REPO
from helpers.hub_cache import COMMIT, hub_cache
from vit_plugin.checkpoint import CheckpointError, read_checkpoint_file
from vit_plugin.cli.convert_checkpoint import main as convert_main
from vit_plugin.cli.infer import main as infer_main
from vit_plugin.models import ViT

TOL = 1e-5


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / 'hub-cache'
    cache.mkdir()
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setenv('HF_HUB_CACHE', str(cache))
    return str(cache)


def build(module_cfg):
    from mmpretrain.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return MODELS.build(module_cfg)


def classifier(hf_cfg, img_size=None, hidden_dim=None, num_classes=3, **backbone):
    arch = dict(embed_dims=hf_cfg.hidden_size, num_layers=hf_cfg.num_hidden_layers,
                num_heads=hf_cfg.num_attention_heads, mlp_dims=hf_cfg.intermediate_size)
    return build(dict(type='ImageClassifier', neck=None,
                      backbone=dict(type='vit_plugin.ViT', arch=arch, img_size=img_size or hf_cfg.image_size,
                                    patch_size=hf_cfg.patch_size, **backbone),
                      head=dict(type='VisionTransformerClsHead', num_classes=num_classes,
                                in_channels=hf_cfg.hidden_size, hidden_dim=hidden_dim)))


def images(size, n=2):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(size))


# Non-default patch and image sizes; one config with exact GELU, one with transformers' tanh GELU.
HF_CASES = {
    'vitmodel-p8-32px-gelu': dict(image_size=32, patch_size=8, hidden_act='gelu'),
    'classifier-p4-24px-tanh': dict(image_size=24, patch_size=4, hidden_act='gelu_pytorch_tanh', num_labels=3,
                                    id2label={0: 'cat', 1: 'dog', 2: 'owl'}, label2id={'cat': 0, 'dog': 1, 'owl': 2}),
}


def hf_model(case):
    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    **HF_CASES[case])
    model = ViTModel(cfg) if case.startswith('vitmodel') else ViTForImageClassification(cfg)
    return model.eval(), cfg


def hf_outputs(model, x, resized=False):
    with torch.no_grad():
        out = model(x, interpolate_pos_encoding=resized)
    return out.pooler_output if isinstance(model, ViTModel) else out.logits


def ours_outputs(model, x):
    model.eval()
    with torch.no_grad():
        feats = model.backbone(x)
        return model.head.pre_logits(feats) if hasattr(model.head.layers, 'pre_logits') else model.head(feats)


@pytest.mark.parametrize('case', sorted(HF_CASES))
def test_transformers_checkpoints_load_through_every_path_and_match_transformers(case, tmp_path, offline_cache):
    hf, cfg = hf_model(case)
    pooled = isinstance(hf, ViTModel)
    folder = tmp_path / 'snapshot'
    hf.save_pretrained(folder)  # model.safetensors + config.json
    bin_folder = tmp_path / 'bin'
    hf.save_pretrained(bin_folder, safe_serialization=False)  # pytorch_model.bin + config.json
    assert sorted(os.listdir(folder)) == ['config.json', 'model.safetensors']
    hub_cache(offline_cache, 'google/vit-tiny-test', str(folder))
    paths = dict(folder=str(folder), file=str(folder / 'model.safetensors'), hub='hf-hub:google/vit-tiny-test',
                 hub_at_commit=f'hf-hub:google/vit-tiny-test@{COMMIT}', bin=str(bin_folder / 'pytorch_model.bin'))
    x, size = images(cfg.image_size), cfg.image_size
    big = size + 2 * cfg.patch_size  # a resized grid: loaded with transformers' bicubic resize
    x_big = images(big)
    hidden = cfg.hidden_size if pooled else None
    for name, path in paths.items():
        model = classifier(cfg, hidden_dim=hidden)
        result = load_checkpoint(model, path, map_location='cpu', strict=False)  # what load_from runs
        missing = set(model.state_dict()) - set(result['state_dict'])
        assert missing <= ({'head.layers.head.weight', 'head.layers.head.bias'} if pooled else set()), (name, missing)
        assert {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-12}, name
        diff = (ours_outputs(model, x) - hf_outputs(hf, x)).abs().max().item()
        assert diff < TOL, (name, diff)
        if not pooled:
            assert result['meta']['dataset_meta']['classes'] == ['cat', 'dog', 'owl']

        resized = classifier(cfg, img_size=big, hidden_dim=hidden, pos_embed_load_mode='bicubic')
        load_checkpoint(resized, path, map_location='cpu', strict=False)
        diff = (ours_outputs(resized, x_big) - hf_outputs(hf, x_big, resized=True)).abs().max().item()
        assert diff < TOL, (name, 'resized', diff)

    # init_cfg of a bare backbone: the class token after the final norm equals transformers' own
    arch = dict(embed_dims=32, num_layers=2, num_heads=4, mlp_dims=64)
    backbone = ViT(arch=arch, img_size=size, patch_size=cfg.patch_size,
                   init_cfg=dict(type='Pretrained', checkpoint=paths['hub'])).eval()
    backbone.init_weights()
    with torch.no_grad():
        cls = backbone(x)[-1]
        ref = (hf if pooled else hf.vit)(x).last_hidden_state[:, 0]
    assert (cls - ref).abs().max().item() < TOL


def test_transformers_weights_without_config_keep_the_models_eps_and_say_so(tmp_path):
    hf, cfg = hf_model('vitmodel-p8-32px-gelu')
    hf.save_pretrained(tmp_path)
    os.remove(tmp_path / 'config.json')
    model = classifier(cfg, hidden_dim=32)
    load_checkpoint(model, str(tmp_path / 'model.safetensors'), map_location='cpu', strict=False)
    assert {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-6}  # nothing substituted
    diff = (ours_outputs(model, images(32)) - hf_outputs(hf, images(32))).abs().max().item()
    assert 1e-7 < diff < 1e-3  # the eps of the two models differ, and only that


def timm_model(img_size=32):
    torch.manual_seed(1)
    return timm.create_model('vit_small_patch16_224', pretrained=False, img_size=img_size, patch_size=8, embed_dim=32,
                             depth=2, num_heads=4, mlp_ratio=2.0, num_classes=5).eval()


def test_timm_safetensors_loads_with_init_cfg_and_from_the_hub_cache(tmp_path, offline_cache):
    source = timm_model()
    folder = tmp_path / 'timm'
    folder.mkdir()
    save_file(source.state_dict(), str(folder / 'model.safetensors'))
    (folder / 'config.json').write_text(json.dumps(dict(architecture='vit_small_patch16_224', num_classes=5)))
    hub_cache(offline_cache, 'timm/vit_tiny_test.augreg_in21k', str(folder))
    x, x_big = images(32), images(48)
    big = timm_model(48)
    big_state = dict(source.state_dict())
    # timm's resize without anti-aliasing: torch's anti-aliased bicubic uses another cubic kernel even when
    # upsampling (timm's default; 9.5e-4 apart in these features), which pos_embed_load_mode does not offer
    big_state['pos_embed'] = timm.layers.resample_abs_pos_embed(big_state['pos_embed'], (6, 6), num_prefix_tokens=1,
                                                                antialias=False)
    big.load_state_dict(big_state)
    arch = dict(embed_dims=32, num_layers=2, num_heads=4, mlp_dims=64)
    for path in (str(folder / 'model.safetensors'), 'hf-hub:timm/vit_tiny_test.augreg_in21k'):
        model = ViT(arch=arch, img_size=32, patch_size=8, init_cfg=dict(type='Pretrained', checkpoint=path)).eval()
        model.init_weights()
        resized = ViT(arch=arch, img_size=48, patch_size=8, pos_embed_load_mode='bicubic',
                      init_cfg=dict(type='Pretrained', checkpoint=path)).eval()
        resized.init_weights()
        with torch.no_grad():
            assert (model(x)[-1] - source.forward_features(x)[:, 0]).abs().max().item() < TOL
            assert (resized(x_big)[-1] - big.forward_features(x_big)[:, 0]).abs().max().item() < TOL


@pytest.mark.parametrize('hidden_dim', [None, 32])
def test_ours_to_transformers_loads_without_missing_keys_and_back(hidden_dim, tmp_path, offline_cache):
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
                    patch_size=8)
    torch.manual_seed(2)
    ours = classifier(cfg, hidden_dim=hidden_dim, gelu_approximate='tanh', norm_eps=1e-6)
    for p in ours.parameters():
        torch.nn.init.normal_(p, std=0.2)
    src = tmp_path / 'ours.pth'
    torch.save(dict(state_dict=ours.state_dict(), meta=dict(dataset_meta=dict(classes=['a', 'b', 'c']))), src)
    out = tmp_path / 'hf'
    assert convert_main([str(src), str(out), '--dst-format', 'transformers', '--num-heads', '4']) == 0
    kind = ViTModel if hidden_dim else ViTForImageClassification
    hf, info = kind.from_pretrained(out, output_loading_info=True)
    assert info['missing_keys'] == [] and info['unexpected_keys'] == [], info
    hf.eval()
    assert hf.config.layer_norm_eps == 1e-6 and hf.config.hidden_act == 'gelu_pytorch_tanh'
    x = images(32)
    ours_out = ours_outputs(ours, x)
    assert (hf_outputs(hf, x) - ours_out).abs().max().item() < TOL
    if not hidden_dim:
        assert hf.config.id2label == {0: 'a', 1: 'b', 2: 'c'}
    # and back: transformers' folder -> ours gives the same model
    again = classifier(cfg, hidden_dim=hidden_dim)
    load_checkpoint(again, str(out), map_location='cpu', strict=False)
    assert (ours_outputs(again, x) - ours_out).abs().max().item() < TOL


def test_convert_writes_safetensors_that_keep_the_records_and_meta(tmp_path):
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
                    patch_size=8)
    ours = classifier(cfg, img_size=(32, 48), gelu_approximate='tanh')  # a non-square grid: 4x6
    src = tmp_path / 'ours.pth'
    torch.save(dict(state_dict=ours.state_dict(), meta=dict(dataset_meta=dict(classes=['a', 'b', 'c']))), src)
    dst = tmp_path / 'ours.safetensors'
    assert convert_main([str(src), str(dst), '--pos-embed-mode', 'bicubic']) == 0
    with open(dst, 'rb') as f:
        assert f.read(9)[8:9] == b'{'  # a safetensors file, not a pickle
    loaded = read_checkpoint_file(str(dst))
    sd = loaded['state_dict']
    assert sd['backbone.pos_embed_grid'].tolist() == [4, 6]
    assert int(sd['backbone.gelu_approximate']) == 1 and int(sd['backbone.pos_embed_resize_mode']) == 2
    assert loaded['meta']['dataset_meta']['classes'] == ['a', 'b', 'c']
    fresh = classifier(cfg, img_size=(32, 48))
    load_checkpoint(fresh, str(dst), map_location='cpu')
    assert all(m.approximate == 'tanh' for m in fresh.modules() if isinstance(m, torch.nn.GELU))
    x = torch.randn(1, 3, 32, 48)
    assert torch.equal(ours_outputs(fresh, x), ours_outputs(ours, x))


def test_files_that_are_no_checkpoint_get_a_clear_error(tmp_path, offline_cache):
    text = tmp_path / 'weights.pth'
    text.write_text('These are not the weights you are looking for.\n')
    with pytest.raises(CheckpointError, match=r"weights\.pth' is not a checkpoint: it is a text file starting with "
                                              r"'These are not.*\nAccepted: .*safetensors"):
        CheckpointLoader.load_checkpoint(str(text))
    model = ViT(arch=dict(embed_dims=32, num_layers=2, num_heads=4, mlp_dims=64), img_size=32, patch_size=8,
                init_cfg=dict(type='Pretrained', checkpoint=str(text)))
    with pytest.raises(CheckpointError, match='is not a checkpoint'):
        model.init_weights()
    good = tmp_path / 'good.safetensors'
    save_file({'w': torch.zeros(1000)}, str(good))
    truncated = tmp_path / 'cut.safetensors'
    truncated.write_bytes(good.read_bytes()[:2000])
    with pytest.raises(CheckpointError, match=r"cut\.safetensors' is a truncated safetensors file"):
        CheckpointLoader.load_checkpoint(str(truncated))
    with pytest.raises(CheckpointError, match=r'a folder without weights: looked for model\.safetensors'):
        CheckpointLoader.load_checkpoint(str(tmp_path / 'hub-cache'))
    with pytest.raises(CheckpointError, match=r'(?s)hf-hub:google/nothing-here: not in the local Hugging Face cache .*'
                                              r'\n.*huggingface-cli download google/nothing-here'):
        CheckpointLoader.load_checkpoint('hf-hub:google/nothing-here')
    hf, _ = hf_model('vitmodel-p8-32px-gelu')
    hf.save_pretrained(tmp_path / 'snap')
    hub_cache(offline_cache, 'google/vit-tiny-test', str(tmp_path / 'snap'))
    with pytest.raises(CheckpointError, match=r'(?s)hf-hub:google/vit-tiny-test@v2: not in the local .*revision'):
        CheckpointLoader.load_checkpoint('hf-hub:google/vit-tiny-test@v2')


def test_infer_prints_the_class_names_of_a_transformers_classifier(tmp_path):
    hf, _ = hf_model('classifier-p4-24px-tanh')
    hf.save_pretrained(tmp_path / 'snap')
    cfg = tmp_path / 'tiny.py'
    cfg.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
model = dict(backbone=dict(arch=dict(_delete_=True, embed_dims=32, num_layers=2, num_heads=4, mlp_dims=64),
                           img_size=24, patch_size=4),
             head=dict(in_channels=32, num_classes=3))
test_dataloader = dict(dataset=dict(data_root={str(tmp_path / 'digits')!r}))
""")
    image = tmp_path / 'x.png'
    Image.fromarray((torch.rand(24, 24, 3) * 255).to(torch.uint8).numpy()).save(image)
    results = infer_main([str(cfg), str(tmp_path / 'snap'), str(image), '--device', 'cpu', '--topk', '3'])
    assert sorted(e['name'] for e in results[0]['topk']) == ['cat', 'dog', 'owl']


def test_mmpretrain_models_import_with_the_installed_transformers():
    """mmpretrain's multimodal models need transformers below the versions that broke them; the pin
    of both stacks keeps transformers at one it accepts."""
    code = ('import mmpretrain.models\n'
            'from mmpretrain.models.multimodal.blip import language_model\n'
            'assert language_model.PreTrainedModel is not None, "mmpretrain did not get transformers"\n')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=REPO)
    import mmpretrain
    pin = 'transformers<=4.51.3' if mmpretrain.__version__.startswith('1.2.') else 'transformers<5'
    assert done.returncode == 0, (
        f'import mmpretrain.models fails with transformers {transformers.__version__} (mmpretrain '
        f'{mmpretrain.__version__}); pin {pin} in the test requirements.\n{done.stderr[-1500:]}')
