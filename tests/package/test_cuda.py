"""Training on a CUDA GPU: bf16 steps, the non-finite guard under an fp16 scaler, the memory planner
against the allocator's peak, the detector with its operators on the GPU, pinned loader memory.

Every test here is marked ``cuda`` and skips, saying so, on a machine without a CUDA device
(``pytest -m cuda`` runs just these; ``make gpu-report`` runs them and puts their results in its
report). Their CPU counterparts run everywhere: tests/engine/optimizers/test_amp.py, tests/engine/hooks/test_nonfinite_guard.py,
tests/benchmarks/test_memory_planner.py, tests/models/necks/test_simple_fpn.py.
"""
import os.path as osp

import pytest
import torch

from helpers.common import REPO

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU (torch.cuda.is_available() '
                                 'is False)')]

CONFIGS = osp.join(REPO, 'configs')
# bf16 keeps 8 bits of mantissa (relative rounding 2**-9): over 20 AdamW steps of a 2-block ViT the
# per-step losses of a bf16 and an fp32 run stay within this distance (the CPU test, tests/engine/optimizers/test_amp.py,
# sees at most 0.002 with the same model and data).
LOSS_ATOL = 0.01


@pytest.fixture
def full_fp32():
    """fp32 matmuls in full precision (no TF32) for the test's reference, restored afterwards."""
    from vit_plugin.engine.device_defaults import set_tf32
    set_tf32(False)
    yield
    set_tf32(True)


def _bf16_native():
    from vit_plugin.engine.optimizers import cuda_bf16_native
    return cuda_bf16_native()


def test_bf16_training_step_follows_fp32(full_fp32):
    if not _bf16_native():
        pytest.skip(f'{torch.cuda.get_device_name()} has no native bf16')
    from mmengine.optim import build_optim_wrapper
    from helpers.toy_models import template_batches, toy_classifier

    def train(wrapper):
        model = toy_classifier().cuda()
        optim = build_optim_wrapper(model, dict(wrapper, optimizer=dict(type='AdamW', lr=1e-3, fused=True)))
        dtypes = {}

        def record(module, args, out):  # returns None: a forward hook's return value replaces the output
            dtypes.setdefault('qkv', out.dtype)

        model.backbone.blocks[0].attn.qkv.register_forward_hook(record)
        losses = []
        for batch in template_batches():
            batch = dict(batch, inputs=[x.cuda() for x in batch['inputs']])
            losses.append(model.train_step(batch, optim)['loss'].item())
        return losses, optim, dtypes

    fp32, _, _ = train(dict(type='OptimWrapper'))
    bf16, optim, dtypes = train(dict(type='vit_plugin.AutocastOptimWrapper', dtype='bfloat16'))
    assert optim.loss_scaler is None and dtypes['qkv'] == torch.bfloat16
    diffs = [abs(a - b) for a, b in zip(fp32, bf16)]
    assert max(diffs) < LOSS_ATOL, (fp32, bf16)
    assert fp32[-1] < fp32[0] - 0.5 and bf16[-1] < bf16[0] - 0.5 and max(diffs) > 0


def test_guard_skips_an_fp16_overflow_on_the_device(monkeypatch):
    from mmengine.optim import build_optim_wrapper

    import vit_plugin  # noqa: F401  (registers vit_plugin.*)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 1)).cuda()
    wrapper = build_optim_wrapper(model, dict(type='vit_plugin.GuardedAutocastOptimWrapper', dtype='float16',
                                              loss_scale=dict(init_scale=256.),
                                              optimizer=dict(type='AdamW', lr=1e-2, fused=True)))
    x = torch.randn(8, 16, device='cuda')

    def update(inject=False):
        with wrapper.optim_context(model):
            loss = model(x).float().pow(2).mean()
        handle = model[0].weight.register_hook(lambda g: torch.full_like(g, float('inf'))) if inject else None
        wrapper.update_params(loss)
        if handle is not None:
            handle.remove()
        return wrapper.take_verdict()

    update()
    params = [p.detach().clone() for p in model.parameters()]
    state = [v.clone() for s in wrapper.optimizer.state.values() for v in s.values()]

    def host_read(*args, **kwargs):
        raise AssertionError('host read of a tensor during the guarded step')

    with monkeypatch.context() as patch:  # the verdict and the skip stay on the GPU
        for name in ('item', 'tolist', '__bool__', '__float__', '__int__'):
            patch.setattr(torch.Tensor, name, host_read)
        verdict = update(inject=True)
    assert verdict.tolist() == [0.0, 1.0]  # the loss is finite, the gradients are not
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(state, (v for s in wrapper.optimizer.state.values()
                                                           for v in s.values())))
    assert wrapper.loss_scaler.get_scale() == 128.
    assert update().tolist() == [0.0, 0.0]


@pytest.mark.parametrize('with_cp', [False, True], ids=['plain', 'with_cp'])
def test_planner_within_10_percent_of_the_measured_peak(with_cp):
    # ViT-B/16 at 224 px, bf16 autocast, fused AdamW: what tools/train.py --amp runs on this GPU.
    from benchmarks.device_checks import ClassifierTrainer
    from benchmarks.memory_planner import estimate, model_shape
    config = osp.join(CONFIGS, 'vit_b16_in21k.py')
    trainer = ClassifierTrainer(config, 'cuda', with_cp=with_cp, bf16=True)
    batch = 64
    measured = trainer.peak_bytes(batch)
    planned = estimate(model_shape(trainer.cfg), batch, with_cp=with_cp, bf16=True, device='cuda').peak
    assert planned == pytest.approx(measured, rel=0.10), (planned / 2**30, measured / 2**30)


def test_detection_step_runs_its_operators_on_the_gpu():
    from benchmarks.device_checks import detection_steps, mmcv_ops_origin
    result = detection_steps(osp.join(CONFIGS, 'mask_rcnn_vit_tiny_simplefpn_shapes.py'), 'cuda', img_size=160,
                             batch=2, steps=2)
    assert result['finite'] and result['outputs_device'].startswith('cuda'), result
    assert 'none' not in mmcv_ops_origin()['description']

    from mmcv.ops import nms, roi_align  # the operators the detector used, on CUDA tensors
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [50., 50., 60., 60.]], device='cuda')
    _, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7], device='cuda'), 0.5)
    assert keep.tolist() == [0, 2]
    feature = torch.arange(64., device='cuda').reshape(1, 1, 8, 8)
    rois = torch.tensor([[0., 0., 0., 4., 4.]], device='cuda')
    assert roi_align(feature, rois, (2, 2), 1.0, 2, 'avg', True).is_cuda


def test_data_loaders_pin_memory_on_cuda(tmp_path, digits_root):
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner

    from vit_plugin.evaluation.model_loading import load_config
    from vit_plugin.engine.device_defaults import apply_device_defaults
    cfg = load_config(osp.join(CONFIGS, 'vit_demo_digits.py'))
    init_default_scope('mmpretrain')
    cfg.work_dir = str(tmp_path)
    cfg.train_dataloader.dataset.data_root = digits_root
    cfg.train_dataloader.num_workers = 0
    messages = apply_device_defaults(cfg, 'cuda')
    assert cfg.train_dataloader.pin_memory is True and any('pin_memory' in m for m in messages)
    loader = Runner.build_dataloader(cfg.train_dataloader)
    batch = next(iter(loader))
    assert loader.pin_memory and batch['inputs'][0].is_pinned()
