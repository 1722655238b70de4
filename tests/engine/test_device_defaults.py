"""What a GPU run gets by default (vit_plugin.engine.device_defaults), checked on the configs: the fused
optimizer on CUDA only and only where the config chose no kernel, TF32 with its switch, pinned loader
memory on CUDA only."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from helpers.common import REPO
from vit_plugin.engine.device_defaults import apply_device_defaults, optimizer_defaults, set_tf32


@pytest.mark.parametrize('optimizer,device,expected', [
    (dict(type='AdamW', lr=1e-3), 'cuda', dict(type='AdamW', lr=1e-3, fused=True)),
    (dict(type='torch.optim.SGD', lr=0.1), 'cuda', dict(type='torch.optim.SGD', lr=0.1, fused=True)),
    (dict(type='AdamW', lr=1e-3, foreach=False), 'cuda', dict(type='AdamW', lr=1e-3, foreach=False)),  # the config's
    (dict(type='AdamW', lr=1e-3, fused=False), 'cuda', dict(type='AdamW', lr=1e-3, fused=False)),
    (dict(type='Lamb', lr=1e-3), 'cuda', dict(type='Lamb', lr=1e-3)),  # no fused kernel in torch
    (dict(type='AdamW', lr=1e-3), 'cpu', dict(type='AdamW', lr=1e-3)),
    (dict(type='AdamW', lr=1e-3), 'xla', dict(type='AdamW', lr=1e-3)),
])
def test_fused_optimizer_default(optimizer, device, expected):
    wrapper = dict(type='OptimWrapper', optimizer=dict(optimizer))
    optimizer_defaults(wrapper, device)
    assert wrapper['optimizer'] == expected


def test_layer_decay_configs_build_a_fused_adamw():
    # The constructor passes the kernel choice through to torch (built on the CPU: fused AdamW runs there too).
    from mmengine.optim import build_optim_wrapper
    from vit_plugin.evaluation.model_loading import load_config
    from mmengine.registry import MODELS
    cfg = load_config(osp.join(REPO, 'configs', 'vit_b16_in21k_ft_cifar10_384.py'),
                      {'model.backbone.arch': 'ti', 'model.backbone.img_size': 32, 'model.head.in_channels': 192})
    optimizer_defaults(cfg.optim_wrapper, 'cuda')
    wrapper = build_optim_wrapper(MODELS.build(cfg.model), cfg.optim_wrapper)
    assert all(group['fused'] for group in wrapper.optimizer.param_groups)


def test_cpu_run_keeps_its_loaders_and_optimizer():
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_demo_digits.py'))
    before = cfg.to_dict()
    assert apply_device_defaults(cfg, 'cpu') == [] and cfg.to_dict() == before


def test_cuda_defaults_on_a_config_and_the_tf32_switch():
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_demo_digits.py'))
    cfg.val_dataloader.pin_memory = False  # said by the config: kept
    try:
        messages = apply_device_defaults(cfg, 'cuda')
        assert torch.get_float32_matmul_precision() == 'high' and torch.backends.cudnn.allow_tf32
        assert cfg.train_dataloader.pin_memory is True and cfg.val_dataloader.pin_memory is False
        assert cfg.optim_wrapper.optimizer.fused is True
        assert any('TF32' in m for m in messages) and any('pin_memory=True for train_dataloader' in m for m in messages)
        cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_demo_digits.py'))
        cfg.env_cfg.tf32 = False
        assert any('TF32 off' in m for m in apply_device_defaults(cfg, 'cuda'))
        assert torch.get_float32_matmul_precision() == 'highest' and not torch.backends.cudnn.allow_tf32
    finally:
        set_tf32(False)  # the process's state as torch starts it
        torch.backends.cudnn.allow_tf32 = True


# ---- through tools/train.py's command line (vit_plugin.cli.train) and vit_plugin.Runner ----------------

def _merged(*flags, config='vit_demo_digits.py'):
    from vit_plugin.cli import train
    cfg_file = osp.join(REPO, 'configs', config)
    return train.merge_args(Config.fromfile(cfg_file), train.parse_args([cfg_file, *flags, '--work-dir', '/tmp/x']))


def test_compile_flag_uses_mmengines_compile_option():
    assert _merged('--compile').compile is True
    assert _merged('--compile', '--cfg-options', 'compile.mode=max-autotune').compile == dict(mode='max-autotune')
    assert 'compile' not in _merged()


def test_no_tf32_and_no_pin_memory_flags():
    """The options set the keys; the runner applies the defaults where the config leaves them."""
    from vit_plugin.engine.runner import prepare_run
    try:
        cfg = prepare_run(_merged(), device='cuda')  # as on a GPU host
        assert cfg.env_cfg.get('tf32', True) and torch.get_float32_matmul_precision() == 'high'
        assert cfg.train_dataloader.pin_memory is True and cfg.optim_wrapper.optimizer.fused is True
        cfg = prepare_run(_merged('--no-tf32', '--no-pin-memory'), device='cuda')
        assert cfg.env_cfg.tf32 is False and torch.get_float32_matmul_precision() == 'highest'
        assert cfg.train_dataloader.pin_memory is False
    finally:
        set_tf32(False)
        torch.backends.cudnn.allow_tf32 = True


def test_more_processes_than_gpus_is_refused_with_the_way_out(monkeypatch):
    from vit_plugin.engine.runner import RunSetupError, check_processes_per_gpu
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    monkeypatch.setenv('LOCAL_WORLD_SIZE', '2')
    with pytest.raises(RunSetupError, match='2 processes on this node but 1 visible GPU.*CUDA_VISIBLE_DEVICES='):
        check_processes_per_gpu('pytorch')
    monkeypatch.setenv('LOCAL_WORLD_SIZE', '1')
    check_processes_per_gpu('pytorch')
