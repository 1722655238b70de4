"""Mixed precision: the CPU bf16 path trains like fp32 and keeps the sensitive ops in fp32, bf16 runs
without a loss scaler, fp16 with one, ``--amp`` picks bf16 where the GPU computes it natively and fp16
with loss scaling elsewhere, and bf16 on a GPU without it is refused with the alternative."""
import os.path as osp

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper

from helpers.common import REPO
from helpers.toy_models import template_batches, toy_classifier
import vit_plugin  # noqa: F401  (registers vit_plugin.*)
from vit_plugin.engine.optimizers import use_mixed_precision

# bf16 keeps 8 bits of mantissa (relative rounding 2**-9); over 20 AdamW steps of a 2-block ViT the
# per-step losses of the two runs stay within this absolute distance (cross-entropy falls from
# ~2.5 to ~0.1; the largest distance seen is 0.002).
LOSS_ATOL = 0.01


def _train(wrapper_type, init_state=None, probe=None):
    model = toy_classifier()
    if init_state is not None:
        model.load_state_dict(init_state)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    wrapper = build_optim_wrapper(model, dict(type=wrapper_type, optimizer=dict(type='AdamW', lr=1e-3)))
    if probe is not None:
        probe(model)
    losses = [model.train_step(b, wrapper)['loss'].detach().item() for b in template_batches()]
    return losses, state, model


def test_bf16_training_follows_fp32_within_tolerance():
    fp32, init, _ = _train('OptimWrapper')
    dtypes = {}

    def probe(model):
        def record(name):
            def hook(mod, args, out):
                dtypes.setdefault(name, out.dtype)
            return hook
        model.backbone.blocks[0].attn.qkv.register_forward_hook(record('qkv'))
        model.backbone.blocks[0].mlp.fc1.register_forward_hook(record('fc1'))
        model.backbone.blocks[0].norm1.register_forward_hook(record('norm1'))
        model.backbone.norm.register_forward_hook(record('final_norm'))
        model.head.layers.head.register_forward_hook(record('logits'))

    bf16, _, model = _train('vit_plugin.CPUAmpOptimWrapper', init_state=init, probe=probe)
    # It really computed in bf16 (else the comparison would be vacuous) ...
    assert dtypes['qkv'] == dtypes['fc1'] == dtypes['logits'] == torch.bfloat16, dtypes
    # ... with LayerNorm in fp32, and weights (so the optimizer state) still fp32.
    assert dtypes['norm1'] == dtypes['final_norm'] == torch.float32, dtypes
    assert all(p.dtype == torch.float32 for p in model.parameters())
    diffs = [abs(a - b) for a, b in zip(fp32, bf16)]
    assert len(diffs) == 20 and max(diffs) < LOSS_ATOL, (max(diffs), fp32, bf16)
    assert fp32[-1] < fp32[0] - 0.5 and bf16[-1] < bf16[0] - 0.5  # both learn
    assert max(diffs) > 0  # and differ: the bf16 run is not an fp32 run


def test_softmax_and_losses_stay_fp32_under_cpu_autocast():
    wrapper = build_optim_wrapper(torch.nn.Linear(4, 4), dict(type='vit_plugin.CPUAmpOptimWrapper',
                                                              optimizer=dict(type='SGD', lr=0.1)))
    x = torch.randn(2, 4, 8, 16)
    bias = torch.zeros(2, 4, 8, 8, requires_grad=True)
    with wrapper.optim_context(torch.nn.Linear(1, 1)):
        h = torch.nn.functional.linear(x, torch.randn(16, 16))
        assert h.dtype == torch.bfloat16
        assert F.softmax(h, -1).dtype == h.softmax(-1).dtype == F.log_softmax(h, -1).dtype == torch.float32
        assert F.layer_norm(h, (16,)).dtype == torch.float32
        assert F.cross_entropy(h[:, 0, 0], torch.zeros(2, dtype=torch.long)).dtype == torch.float32
        # Attention that needs the explicit softmax (trainable bias) runs in fp32; the fused kernel
        # (no bias) is left to autocast: it accumulates its softmax in fp32 internally.
        assert F.scaled_dot_product_attention(h, h, h, attn_mask=bias).dtype == torch.float32
        assert F.scaled_dot_product_attention(h, h, h).dtype == torch.bfloat16


def test_cpu_wrapper_refuses_fp16():
    with pytest.raises(ValueError, match="dtype='float16' is not supported.*'bfloat16'.*optim_wrapper.dtype"):
        build_optim_wrapper(torch.nn.Linear(2, 2), dict(type='vit_plugin.CPUAmpOptimWrapper', dtype='float16',
                                                        optimizer=dict(type='SGD', lr=0.1)))


@pytest.mark.parametrize('device,precision,expected', [
    ('cuda', 'bf16', dict(type='vit_plugin.AutocastOptimWrapper', dtype='bfloat16')),  # no loss scaler
    ('cuda', 'fp16', dict(type='vit_plugin.AutocastOptimWrapper', dtype='float16', loss_scale='dynamic')),
    ('cpu', 'bf16', dict(type='vit_plugin.CPUAmpOptimWrapper', dtype='bfloat16')),
    ('xla', 'bf16', dict(type='AmpOptimWrapper', dtype='bfloat16')),
])
def test_mixed_precision_picks_the_wrapper_by_device(device, precision, expected):
    cfg = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3), clip_grad=dict(max_norm=1.0))
    out = use_mixed_precision(cfg, precision, device)
    assert out == dict(expected, optimizer=dict(type='AdamW', lr=1e-3), clip_grad=dict(max_norm=1.0))


def test_fp16_off_gpu_is_refused_with_the_fix():
    with pytest.raises(ValueError, match='needs a GPU.*--amp bf16'):
        use_mixed_precision(dict(type='OptimWrapper'), 'fp16', 'cpu')


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the CPU choice of --amp')
def test_train_amp_flag_on_cpu(tmp_path):
    from vit_plugin.cli import train as tool
    cfg_file = osp.join(REPO, 'configs', 'vit_demo_digits.py')
    for flag in (['--amp', 'bf16'], ['--amp']):
        cfg = Config.fromfile(cfg_file)
        tool.merge_args(cfg, tool.parse_args([cfg_file, *flag, '--work-dir', str(tmp_path)]))
        assert cfg.optim_wrapper.type == 'vit_plugin.GuardedCPUAmpOptimWrapper', flag  # the config's guard stays
        assert cfg.optim_wrapper.dtype == 'bfloat16'
    cfg = Config.fromfile(cfg_file)
    with pytest.raises(SystemExit, match='--amp fp16: fp16 mixed precision needs a GPU'):
        tool.merge_args(cfg, tool.parse_args([cfg_file, '--amp', 'fp16']))


def test_bf16_has_no_loss_scaler_and_refuses_one():
    wrapper = build_optim_wrapper(torch.nn.Linear(2, 2), dict(type='vit_plugin.AutocastOptimWrapper',
                                                              dtype='bfloat16', optimizer=dict(type='SGD', lr=0.1)))
    assert wrapper.loss_scaler is None and wrapper.device_type == 'cpu' and 'loss_scaler' not in wrapper.state_dict()
    with pytest.raises(ValueError, match='bf16 has fp32.s range.*drop optim_wrapper.loss_scale'):
        build_optim_wrapper(torch.nn.Linear(2, 2), dict(type='vit_plugin.AutocastOptimWrapper', dtype='bfloat16',
                                                        loss_scale='dynamic', optimizer=dict(type='SGD', lr=0.1)))


def test_fp16_scales_the_loss_and_checkpoints_the_scaler():
    # On the CPU here (torch.amp.GradScaler('cpu') behaves as on a GPU): the gradients the optimizer
    # sees are the true ones, the scaler's state travels with the checkpoint.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    reference = torch.nn.Linear(4, 1)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(8, 4)
    wrapper = build_optim_wrapper(model, dict(type='vit_plugin.AutocastOptimWrapper', dtype='float16',
                                              loss_scale=dict(init_scale=1024.), optimizer=dict(type='SGD', lr=0.1)))
    with wrapper.optim_context(model):
        out = model(x)
    assert out.dtype == torch.float16
    wrapper.backward(out.float().pow(2).mean())
    scaled = model.weight.grad.clone()
    wrapper.step()
    reference(x).pow(2).mean().backward()
    assert torch.allclose(scaled / 1024., reference.weight.grad, rtol=1e-2)  # fp16 forward
    assert wrapper.state_dict()['loss_scaler']['scale'] == 1024.
    restored = build_optim_wrapper(torch.nn.Linear(4, 1), dict(type='vit_plugin.AutocastOptimWrapper',
                                                               dtype='float16', optimizer=dict(type='SGD', lr=0.1)))
    restored.load_state_dict(wrapper.state_dict())
    assert restored.loss_scaler.get_scale() == 1024.


def _fake_gpu(monkeypatch, capability, name):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 0)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda index=None: capability)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda index=None: name)
    monkeypatch.setattr(torch.version, 'hip', None)


@pytest.mark.parametrize('capability,name,expected', [((9, 0), 'NVIDIA H100 80GB HBM3', 'bf16'),
                                                      ((8, 0), 'NVIDIA A100-SXM4-80GB', 'bf16'),
                                                      ((7, 5), 'Tesla T4', 'fp16'),
                                                      ((7, 0), 'Tesla V100-SXM2-32GB', 'fp16')])
def test_amp_without_a_value_picks_bf16_where_the_gpu_has_it(monkeypatch, capability, name, expected):
    from vit_plugin.engine.optimizers import resolve_precision
    _fake_gpu(monkeypatch, capability, name)
    precision, message = resolve_precision('auto', 'cuda')
    assert precision == expected and name in message  # the log says which and why
    assert ('without loss scaling' if expected == 'bf16' else 'dynamic loss scaling') in message
    assert resolve_precision('fp16', 'cuda')[0] == 'fp16'
    assert resolve_precision('auto', 'cpu')[0] == resolve_precision('auto', 'xla')[0] == 'bf16'


def test_bf16_on_a_gpu_without_it_stops_with_the_alternative(monkeypatch):
    from vit_plugin.engine.optimizers import resolve_precision
    _fake_gpu(monkeypatch, (7, 0), 'Tesla V100-SXM2-32GB')
    # torch.cuda.is_bf16_supported() says True on a V100 (emulation): the check must not rely on it.
    with pytest.raises(ValueError, match=r'Tesla V100-SXM2-32GB \(compute capability 7.0\) has none.*--amp fp16'):
        resolve_precision('bf16', 'cuda')
    with pytest.raises(ValueError, match='needs a GPU with native bf16'):
        # a config that names the wrapper directly is checked when it is built
        from vit_plugin.engine.optimizers import AutocastOptimWrapper
        AutocastOptimWrapper(dtype='bfloat16', device_type='cuda',
                             optimizer=torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
