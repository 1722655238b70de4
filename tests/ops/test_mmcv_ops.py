"""mmcv's compiled operators from vit_plugin (vit_plugin.ops) on an mmcv without them (mmcv-lite):

- exactness against compiled mmcv 2.1.0 through mmcv's own wrappers (a committed fixture:
  tests/ops/fixtures/make_mmcv_ops_fixture.py), and the sigmoid focal loss against mmdet's PyTorch version;
- every other operator name exists and raises an error that says how to get compiled mmcv;
- on a GPU (``cuda`` marker), the CUDA paths against the CPU results."""
import os.path as osp
import sys

import mmcv
import mmcv.ops  # noqa: F401  (the pinned stack: a missing mmcv fails the module)
import numpy as np
import pytest
import torch
from mmdet.models.losses.focal_loss import py_sigmoid_focal_loss
from mmdet.models.losses.focal_loss import sigmoid_focal_loss as mmdet_cuda_path_focal_loss

import vit_plugin.ops as ops
import vit_plugin.ops.ext as provider
from helpers.common import REPO


FIXTURE = osp.join(REPO, 'tests', 'ops', 'fixtures', 'mmcv_ops_2.1.0.npz')
OP_MODULES = ('nms', 'roi_align', 'focal_loss', 'deform_conv')


def _installed_ext():
    import mmcv._ext
    return mmcv._ext


def _ext_modules():
    """The operator sets to check: vit_plugin's always, and a compiled mmcv._ext where installed."""
    mods = [('vit_plugin', provider)]
    if not getattr(_installed_ext(), 'VIT_PLUGIN_PROVIDER', False):
        mods.append(('compiled mmcv', _installed_ext()))
    return mods


def _use(monkeypatch, ext):
    """Makes mmcv's wrappers call ``ext`` (mmcv's op modules look ``ext_module`` up at every call)."""
    for name in OP_MODULES:
        monkeypatch.setattr(sys.modules[f'mmcv.ops.{name}'], 'ext_module', ext)


@pytest.fixture
def with_provider(monkeypatch):
    _use(monkeypatch, provider)


def _cases(group):
    data = np.load(FIXTURE)
    count = int(data[f'{group}_count'])
    return [{key.split('/', 2)[2]: data[key] for key in data.files if key.startswith(f'{group}/{i}/')}
            for i in range(count)]


# ----------------------------------------------------------------------------------------------- exactness
def test_fixture_is_compiled_mmcv_2_1_0_and_covers_the_cases():
    data = np.load(FIXTURE)
    assert str(data['mmcv_version']) == '2.1.0'
    nms = _cases('nms')
    assert {len(c['boxes']) for c in nms} == {0, 1, 64}
    assert {float(c['iou_threshold']) for c in nms} == {0.3, 0.5, 0.6, 0.7, 0.9}
    assert {int(c['offset']) for c in nms} == {0, 1}
    # the cases decide something: suppression happens, and the thresholds keep different sets
    big = [c for c in nms if len(c['boxes']) == 64 and int(c['offset']) == 0 and float(c['score_threshold']) == 0]
    assert len({tuple(c['keep']) for c in big}) == len(big)
    assert all(len(c['keep']) < 64 for c in big if float(c['iou_threshold']) < 0.9)
    rois = _cases('roi')
    assert {(int(c['output_size']), float(c['spatial_scale']), bool(c['aligned']), int(c['sampling_ratio']))
            for c in rois} == {(s, k, a, r) for s in (7, 14) for k in (0.25, 0.0625) for a in (True, False)
                               for r in (0, 2)}
    assert any(len(c['rois']) == 0 for c in rois)
    assert all(np.abs(c['grad_input']).sum() > 0 for c in rois if len(c['rois']))


def test_nms_and_batched_nms_match_compiled_mmcv(monkeypatch):
    """Kept indices identical (order included) and kept boxes / scores within 1e-5, at thresholds that
    float32 rounds up (0.6) and down (0.7), IoUs of exactly 0.5, tied scores, offset 1, 0 and 1 boxes.
    (A compiled mmcv, where installed, is held to its own fixture too.)"""
    for which, ext in _ext_modules():
        _use(monkeypatch, ext)
        _check_nms(which)


def _check_nms(which):
    for i, c in enumerate(_cases('nms')):
        dets, keep = mmcv.ops.nms(torch.from_numpy(c['boxes']), torch.from_numpy(c['scores']),
                                  float(c['iou_threshold']), offset=int(c['offset']),
                                  score_threshold=float(c['score_threshold']), max_num=int(c['max_num']))
        assert keep.dtype == torch.long and keep.tolist() == c['keep'].tolist(), (which, i)
        np.testing.assert_allclose(dets.numpy(), c['dets'], rtol=0, atol=1e-5, err_msg=f'{which} {i}')
    for i, c in enumerate(_cases('batched')):
        nms_cfg = dict(type='nms', iou_threshold=float(c['iou_threshold']))
        dets, keep = mmcv.ops.batched_nms(torch.from_numpy(c['boxes']), torch.from_numpy(c['scores']),
                                          torch.from_numpy(c['idxs']), nms_cfg,
                                          class_agnostic=bool(c['class_agnostic']))
        assert keep.tolist() == c['keep'].tolist(), (which, i)
        np.testing.assert_allclose(dets.numpy(), c['dets'], rtol=0, atol=1e-5, err_msg=f'{which} {i}')


def test_roi_align_and_its_input_gradient_match_compiled_mmcv(monkeypatch):
    for which, ext in _ext_modules():
        _use(monkeypatch, ext)
        for i, c in enumerate(_cases('roi')):
            feature = torch.from_numpy(c['feature_q'].astype(np.float32) / 64).requires_grad_()
            size = int(c['output_size'])
            out = mmcv.ops.roi_align(feature, torch.from_numpy(c['rois']), (size, size), float(c['spatial_scale']),
                                     int(c['sampling_ratio']), 'avg', bool(c['aligned']))
            out.backward(torch.from_numpy(c['grad_q'].astype(np.float32) / 8))
            np.testing.assert_allclose(out.detach().numpy(), c['output'], rtol=0, atol=1e-5, err_msg=f'{which} {i}')
            np.testing.assert_allclose(feature.grad.numpy(), c['grad_input'], rtol=0, atol=1e-5, err_msg=f'{which} {i}')


def test_roi_align_reads_channels_last_maps_by_value(with_provider):
    """torchvision's kernels read a map's values whatever its memory layout (compiled mmcv's CPU kernel
    reads the raw memory as NCHW: tests/models/necks/test_simple_fpn.py)."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 12, 16)
    channels_last = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    plain = x.clone().requires_grad_()
    rois = torch.tensor([[0, 1., 2., 9., 11.], [1, 0., 0., 15., 11.]])
    a = mmcv.ops.roi_align(channels_last, rois, (5, 5), 1.0, 2, 'avg', True)
    b = mmcv.ops.roi_align(plain, rois, (5, 5), 1.0, 2, 'avg', True)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    a.sum().backward()
    b.sum().backward()
    torch.testing.assert_close(channels_last.grad, plain.grad, rtol=0, atol=0)


def test_half_precision_maps_on_the_cpu(with_provider):
    """Under CPU autocast the heads may see bf16 / fp16 maps: NMS and RoIAlign run them in float32 (neither
    torchvision nor compiled mmcv has such CPU kernels) and answer in the input's dtype."""
    torch.manual_seed(0)
    x = torch.randn(1, 4, 16, 16)
    rois = torch.tensor([[0, 1., 2., 12., 13.], [0, 4., 0., 15., 9.]])
    reference = mmcv.ops.roi_align(x, rois, (4, 4), 1.0, 2, 'avg', True)
    for dtype in (torch.bfloat16, torch.float16):
        low = x.to(dtype).requires_grad_()
        out = mmcv.ops.roi_align(low, rois.to(dtype), (4, 4), 1.0, 2, 'avg', True)
        out.float().sum().backward()
        assert out.dtype == low.grad.dtype == dtype
        torch.testing.assert_close(out.float(), reference, rtol=0.02, atol=0.02)
        boxes = torch.tensor([[0., 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]], dtype=dtype)
        assert mmcv.ops.nms(boxes, torch.tensor([.9, .8, .7], dtype=dtype), 0.5)[1].tolist() == [0, 2]


def _focal_inputs(num_classes=5):
    torch.manual_seed(0)
    logits = torch.cat([torch.randn(80, num_classes) * 4,
                        torch.tensor([[-25., 25, -40, 40, 0.]])[:, :num_classes]])  # confident both ways
    target = torch.randint(0, num_classes + 1, (len(logits), ))  # num_classes: background
    target[-1] = num_classes
    return logits, target


@pytest.mark.parametrize('gamma,alpha', [(2.0, 0.25), (1.5, 0.6)])
def test_sigmoid_focal_loss_and_gradient_match_mmdets_pytorch_version(with_provider, gamma, alpha):
    """mmcv's SigmoidFocalLoss on vit_plugin's kernels equals mmdet's py_sigmoid_focal_loss (what mmdet runs
    on a CPU; compiled mmcv has no CPU kernel), with background targets, for the element-wise loss and the
    gradient of the logits."""
    from mmcv.ops import sigmoid_focal_loss
    logits, target = _focal_inputs()
    one_hot = torch.nn.functional.one_hot(target, logits.size(1) + 1)[:, :logits.size(1)]  # as mmdet's FocalLoss
    upstream = torch.rand(logits.shape)
    ours_in = logits.clone().requires_grad_()
    ours = sigmoid_focal_loss(ours_in, target, gamma, alpha, None, 'none')
    ref_in = logits.clone().requires_grad_()
    ref = py_sigmoid_focal_loss(ref_in, one_hot, gamma=gamma, alpha=alpha, reduction='none')
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    (ours * upstream).sum().backward()
    (ref * upstream).sum().backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-5, atol=1e-6)
    assert ours[-1].abs().max() > 10  # the confident wrong logits carry their exact (large) loss
    # 'mean' and 'sum' reductions of mmcv's wrapper
    torch.testing.assert_close(sigmoid_focal_loss(logits, target, gamma, alpha, None, 'mean'), ref.sum() / len(logits))
    torch.testing.assert_close(sigmoid_focal_loss(logits, target, gamma, alpha, None, 'sum'), ref.sum())


def test_mmdets_cuda_focal_loss_path_runs_on_our_kernels(with_provider):
    """mmdet's FocalLoss calls mmcv's kernel (``sigmoid_focal_loss``) only for CUDA tensors; the same
    function on our kernels equals the PyTorch version with mmdet's weights and average factor."""
    logits, target = _focal_inputs()
    weight = torch.rand(len(logits))
    one_hot = torch.nn.functional.one_hot(target, logits.size(1) + 1)[:, :logits.size(1)]
    ours = mmdet_cuda_path_focal_loss(logits, target, weight, gamma=2.0, alpha=0.25, reduction='mean', avg_factor=7.0)
    ref = py_sigmoid_focal_loss(logits, one_hot, weight, gamma=2.0, alpha=0.25, reduction='mean', avg_factor=7.0)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_focal_loss_class_weight_follows_mmcv_and_refuses_background(with_provider):
    from mmcv.ops import sigmoid_focal_loss
    logits, target = _focal_inputs()
    class_weight = torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0])
    foreground = target < logits.size(1)
    plain = sigmoid_focal_loss(logits[foreground], target[foreground], 2.0, 0.25, None, 'none')
    weighted = sigmoid_focal_loss(logits[foreground], target[foreground], 2.0, 0.25, class_weight, 'none')
    torch.testing.assert_close(weighted, plain * class_weight[target[foreground]][:, None])
    with pytest.raises(ValueError, match='background'):
        sigmoid_focal_loss(logits, target, 2.0, 0.25, class_weight, 'none')


# ----------------------------------------------------------------------------------------------- the rest
def test_every_mmcv_operator_exists_and_the_unprovided_ones_say_how_to_get_them(with_provider):
    names = ops.mmcv_ext_names()
    assert len(names) > 100 and set(provider.PROVIDED) <= set(names)
    for name in names:
        assert callable(getattr(provider, name)), name
    for name in sorted(set(names) - set(provider.PROVIDED)):
        with pytest.raises(ops.MissingCompiledOpError) as info:
            getattr(provider, name)()
        message = str(info.value)
        assert f"compiled operator '{name}'" in message and 'has mmcv without compiled code' in message
        assert 'MMCV_OPS=compiled make setup' in message and 'MMCV_WHEEL=' in message, message
    assert not hasattr(provider, '__not_an_operator__')
    # through mmcv's modules: DeformConv2d names itself and the operator
    conv = mmcv.ops.DeformConv2d(4, 4, 3, padding=1)
    with pytest.raises(ops.MissingCompiledOpError,
                       match=r"mmcv\.ops\.deform_conv needs mmcv's compiled operator 'deform_conv_forward'"):
        conv(torch.randn(1, 4, 8, 8), torch.zeros(1, 18, 8, 8))
    with pytest.raises(ops.MissingCompiledOpError, match="pool_mode='max'"):
        mmcv.ops.roi_align(torch.randn(1, 2, 8, 8), torch.tensor([[0, 1., 1., 5., 5.]]), (2, 2), 1.0, 2, 'max', True)


def test_source_is_reported_and_checked():
    """What the set-up's verify prints: where the operators come from, after running them."""
    source = ops.ops_source()
    line = ops.check()
    if source['kind'] == 'provider':
        assert line.startswith(f'torchvision {__import__("torchvision").__version__} (CPU')
        assert source['file'] == provider.__file__
        assert ('CUDA' in line) == (torch.ops.torchvision._cuda_version() > 0)
    else:
        assert source['kind'] == 'compiled' and line.startswith(f'compiled mmcv {mmcv.__version__} (CPU')
    assert ops.describe(dict(kind='compiled', cuda='12.8', archs=['sm_90'], library='compiled mmcv 2.1.0')) == \
        'compiled mmcv 2.1.0 (CPU, CUDA 12.8, sm_90; mmcv._ext)'


# ----------------------------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA GPU visible to torch')
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
def test_cuda_nms_and_roi_align_match_the_cpu(with_provider, dtype):
    torch.manual_seed(0)
    boxes = torch.rand(300, 2) * 200
    boxes = torch.cat([boxes, boxes + torch.rand(300, 2) * 60 + 2], 1)
    scores = torch.randperm(300).float() / 300  # no ties: the CUDA sort is not stable
    for thr in (0.3, 0.5, 0.7):
        _, cpu_keep = mmcv.ops.nms(boxes, scores, thr)
        _, gpu_keep = mmcv.ops.nms(boxes.cuda().to(dtype), scores.cuda().to(dtype), thr)
        if dtype == torch.float32:
            assert gpu_keep.cpu().tolist() == cpu_keep.tolist()
    feature = torch.randn(2, 8, 24, 32)
    rois = torch.tensor([[0, 3., 5., 60., 70.], [1, -10., -5., 40., 30.], [1, 100., 60., 140., 100.]])
    for aligned in (True, False):
        for sampling_ratio in (0, 2):
            x_cpu = feature.clone().requires_grad_()
            out_cpu = mmcv.ops.roi_align(x_cpu, rois, (7, 7), 0.25, sampling_ratio, 'avg', aligned)
            out_cpu.square().sum().backward()
            x_gpu = feature.cuda().to(dtype).requires_grad_()
            out_gpu = mmcv.ops.roi_align(x_gpu, rois.cuda().to(dtype), (7, 7), 0.25, sampling_ratio, 'avg', aligned)
            out_gpu.float().square().sum().backward()
            if dtype == torch.float32:
                torch.testing.assert_close(out_gpu.cpu(), out_cpu, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(x_gpu.grad.cpu(), x_cpu.grad, rtol=1e-5, atol=1e-5)
            else:
                _assert_half_close(out_gpu, out_cpu)
                _assert_half_close(x_gpu.grad, x_cpu.grad)


def _assert_half_close(gpu: torch.Tensor, cpu: torch.Tensor) -> None:
    # The half kernel computes its sampling positions in half precision: 1/32 px apart at 32-64 px of
    # the feature map, where neighbouring values of a unit-normal feature differ by up to about 4: an
    # element can move by a few hundredths (0.023 on an H200); the tensor as a whole stays within
    # fp16's rounding.
    diff = (gpu.float().cpu() - cpu).abs()
    assert diff.max() < 0.1 and diff.mean() < 5e-3, (diff.max(), diff.mean())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA GPU visible to torch')
def test_cuda_focal_loss_and_deterministic_roi_align_backward_match_the_cpu(with_provider):
    from mmcv.ops import sigmoid_focal_loss
    logits, target = _focal_inputs()
    cpu_in, gpu_in = logits.clone().requires_grad_(), logits.cuda().requires_grad_()
    cpu = sigmoid_focal_loss(cpu_in, target, 2.0, 0.25, None, 'mean')
    gpu = sigmoid_focal_loss(gpu_in, target.cuda(), 2.0, 0.25, None, 'mean')
    cpu.backward()
    gpu.backward()
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gpu_in.grad.cpu(), cpu_in.grad, rtol=1e-5, atol=1e-6)
    # with deterministic algorithms the CUDA backward runs the CPU kernel: identical to the CPU
    feature = torch.randn(1, 4, 16, 16)
    rois = torch.tensor([[0, 1., 1., 30., 40.], [0, 5., 5., 50., 60.]])
    x_cpu, x_gpu = feature.clone().requires_grad_(), feature.cuda().requires_grad_()
    mmcv.ops.roi_align(x_cpu, rois, (7, 7), 0.5, 2, 'avg', True).sum().backward()
    torch.use_deterministic_algorithms(True)
    try:
        mmcv.ops.roi_align(x_gpu, rois.cuda(), (7, 7), 0.5, 2, 'avg', True).sum().backward()
    finally:
        torch.use_deterministic_algorithms(False)
    torch.testing.assert_close(x_gpu.grad.cpu(), x_cpu.grad, rtol=0, atol=0)
