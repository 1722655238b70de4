"""mmcv's compiled operators from vit_plugin (vit_plugin.ops) on an mmcv without them (mmcv-lite):

- exactness against compiled mmcv 2.1.0 through mmcv's own wrappers (a committed fixture:
  tests/fixtures/make_mmcv_ops_fixture.py), and the sigmoid focal loss against mmdet's PyTorch version;
- every other operator name exists and raises an error that says how to get compiled mmcv;
- every import order, with and without the start-up hook, and mmdet's / mmpretrain's own tools/train.py
  with ``custom_imports``, on a copy of mmcv without its compiled extension (what mmcv-lite installs);
- the set-up's mmcv plan (``setup_env.sh --plan``) with fake ``nvcc`` / ``nvidia-smi`` and a faked probe;
- on a GPU (``cuda`` marker), the CUDA paths against the CPU results.
"""
import importlib.util
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import textwrap

import mmcv
import mmcv.ops  # noqa: F401  (the pinned stack: a missing mmcv fails the module)
import numpy as np
import pytest
import torch
from mmdet.models.losses.focal_loss import py_sigmoid_focal_loss
from mmdet.models.losses.focal_loss import sigmoid_focal_loss as mmdet_cuda_path_focal_loss

import vit_plugin.ops as ops
import vit_plugin.ops.ext as provider
from vit_plugin.ops import setup_plan
from helpers.common import HELPERS, REPO

FIXTURE = osp.join(REPO, 'tests', 'fixtures', 'mmcv_ops_2.1.0.npz')
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
    reads the raw memory as NCHW: tests/test_detection.py)."""
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


# ----------------------------------------------------------------------------------------------- import orders
@pytest.fixture(scope='module')
def lite_mmcv(tmp_path_factory):
    """A copy of the installed mmcv without its compiled extension (what mmcv-lite installs), first on
    PYTHONPATH; and a site folder holding only the start-up .pth."""
    source = importlib.util.find_spec('mmcv').submodule_search_locations[0]
    root = tmp_path_factory.mktemp('mmcv_lite')
    shutil.copytree(source, root / 'mmcv', ignore=shutil.ignore_patterns('*.so', '*.pyd', 'csrc', '__pycache__'))
    site = tmp_path_factory.mktemp('site')
    ops.install_startup_hook(str(site))
    return root, site


def _env(lite, hook):
    root, site = lite
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), REPO, HELPERS]), OMP_NUM_THREADS='1',
               VIT_PLUGIN_OPS_HOOK='1' if hook else '0')
    env.pop('PJRT_DEVICE', None)
    return env


def _prelude(lite, hook):
    """The start-up .pth runs first (as in an installed environment), else VIT_PLUGIN_OPS_HOOK=0 turns every
    start-up hook off."""
    return f'import site; site.addsitedir({str(lite[1])!r})\n' if hook else ''


def _python(lite, code, hook, timeout=600):
    """Runs ``code`` in a fresh interpreter on the mmcv-lite copy."""
    return subprocess.run([sys.executable, '-c', _prelude(lite, hook) + textwrap.dedent(code)], env=_env(lite, hook),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


WORKS = """
import os.path as osp, mmcv, mmcv._ext as ext, torch
from mmcv.ops import nms
assert not osp.exists(osp.join(osp.dirname(mmcv.__file__), '_ext.py'))
assert getattr(ext, 'VIT_PLUGIN_PROVIDER', False), ext.__file__
assert nms(torch.tensor([[0., 0, 10, 10], [1, 1, 11, 11]]), torch.tensor([.9, .8]), 0.5)[1].tolist() == [0]
print('works:', ext.__file__)
"""


def test_any_import_order_works(lite_mmcv, tmp_path):
    """With the start-up hook (every install has it) any of vit_plugin, mmcv.ops and mmdet.models may come
    first, and mmcv's 'install mmcv rather than mmcv-lite' warning never appears. Without it (vit_plugin
    only on PYTHONPATH, or VIT_PLUGIN_OPS_HOOK=0) importing vit_plugin first works, and mmcv.ops first
    fails at once on the missing module (the docs say what to do). A compiled mmcv._ext, when there is one,
    is found before the hook's finder. One interpreter per case, all at once."""
    modules = ('vit_plugin', 'mmcv.ops', 'mmdet.models')
    cases = {(True, first): ''.join(f'import {m}\n' for m in [first] + [m for m in modules if m != first]) + WORKS
             for first in modules}
    cases[(False, 'vit_plugin')] = 'import vit_plugin\n' + WORKS
    cases[(False, 'mmcv.ops')] = 'import mmcv.ops\n'
    procs = {case: subprocess.Popen([sys.executable, '-c', _prelude(lite_mmcv, case[0]) + code],
                                    env=_env(lite_mmcv, case[0]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, cwd=REPO)
             for case, code in cases.items()}
    # a compiled mmcv._ext (a stand-in module file in another mmcv copy) is found first, the finder kept last
    source = importlib.util.find_spec('mmcv').submodule_search_locations[0]
    shutil.copytree(source, tmp_path / 'mmcv', ignore=shutil.ignore_patterns('*.so', '*.pyd', 'csrc', '__pycache__'))
    (tmp_path / 'mmcv' / '_ext.py').write_text(
        'COMPILED = True\n\ndef __getattr__(name):\n    if name.isupper() or name.startswith("_"):\n'
        '        raise AttributeError(name)\n    return print\n')
    compiled = subprocess.run(
        [sys.executable, '-c', 'import sys, _vit_plugin_mmcv_ext as h; h.install(); import mmcv._ext as e\n'
         'assert e.COMPILED and not hasattr(e, "VIT_PLUGIN_PROVIDER"), e.__file__\n'
         'names = [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path]\n'
         'assert names.index("MmcvExtFinder") > names.index("PathFinder"), names\n'],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO])), capture_output=True, text=True,
        timeout=300)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    results = {case: (proc.wait(timeout=600), *proc.communicate()) for case, proc in procs.items()}
    for (hook, first), (code, out, err) in results.items():
        if (hook, first) == (False, 'mmcv.ops'):
            assert code != 0 and "No module named 'mmcv._ext'" in err, err[-3000:]
            continue
        assert code == 0, ((hook, first), err[-3000:])
        assert 'works: ' + provider.__file__ in out, (hook, first)
        assert 'mmcv-lite' not in err, ((hook, first), err[-2000:])


def test_a_wheel_carries_the_start_up_hook(tmp_path):
    """setup.py's build puts the hook module and its .pth at the top of the wheel (site-packages)."""
    import _vit_plugin_mmcv_ext as hook
    proc = subprocess.run([sys.executable, 'setup.py', '-q', 'build_py', '--build-lib', str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / hook.PTH_NAME).read_text() == hook.PTH_LINE
    assert (tmp_path / '_vit_plugin_mmcv_ext.py').is_file() and (tmp_path / 'vit_plugin' / 'ops' / 'ext.py').is_file()


@pytest.mark.slow
def test_mmdets_own_train_and_test_tools_with_custom_imports(lite_mmcv, tmp_path):
    """mmdet's tools/train.py and tools/test.py (as shipped in its wheel) on a ViT Mask R-CNN config that
    imports vit_plugin through custom_imports: a training step and inference with COCO evaluation on
    mmcv-lite. train.py reads the config before it reaches mmcv.ops, so it needs no start-up hook;
    test.py imports mmdet.evaluation (and with it mmcv.ops) first, so it relies on the hook."""
    tools = osp.join(osp.dirname(importlib.util.find_spec('mmdet').origin), '.mim', 'tools')
    data = str(tmp_path / 'shapes') + '/'
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(textwrap.dedent(f'''
        _base_ = [{osp.join(REPO, 'configs', 'mask_rcnn_vit_tiny_simplefpn_shapes.py')!r}]
        dataset = dict(data_root={data!r}, num_images=dict(train=2, val=2))
        train_dataloader = dict(batch_size=2, dataset=dataset)
        val_dataloader = dict(batch_size=2, dataset=dataset)
        test_dataloader = val_dataloader
        val_evaluator = dict(ann_file={data + 'annotations/instances_val.json'!r})
        test_evaluator = val_evaluator
        train_cfg = dict(max_epochs=1, val_interval=2)
        param_scheduler = []
        default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))
    '''))
    work = tmp_path / 'work'
    train = _python(lite_mmcv, f'''
        import runpy, sys
        sys.argv = ['train.py', {str(cfg)!r}, '--work-dir', {str(work)!r}]
        runpy.run_path({osp.join(tools, 'train.py')!r}, run_name='__main__')
        import mmcv._ext
        assert mmcv._ext.VIT_PLUGIN_PROVIDER
    ''', hook=False)
    assert train.returncode == 0, train.stderr[-4000:]
    assert (work / 'epoch_1.pth').is_file()
    test = _python(lite_mmcv, f'''
        import runpy, sys
        sys.argv = ['test.py', {str(cfg)!r}, {str(work / 'epoch_1.pth')!r}, '--work-dir', {str(work)!r}]
        runpy.run_path({osp.join(tools, 'test.py')!r}, run_name='__main__')
    ''', hook=True)
    assert test.returncode == 0, test.stderr[-4000:]
    assert 'coco/bbox_mAP' in test.stdout + test.stderr


@pytest.mark.slow
def test_mmpretrains_own_train_tool_with_custom_imports(lite_mmcv, tmp_path, digits_root):
    """mmpretrain's tools/train.py on a ViT classification config (custom_imports only, no start-up hook):
    two iterations, and no 'install mmcv rather than mmcv-lite' warning from mmcv's transformer bricks."""
    tools = osp.join(osp.dirname(importlib.util.find_spec('mmpretrain').origin), '.mim', 'tools')
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(textwrap.dedent(f'''
        _base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
        model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=1, num_heads=2, mlp_dims=32)),
                     head=dict(in_channels=32))
        train_dataloader = dict(batch_size=16, dataset=dict(data_root={digits_root!r}, indices=32))
        val_dataloader = dict(dataset=dict(data_root={digits_root!r}, indices=16))
        test_dataloader = val_dataloader
        train_cfg = dict(max_epochs=1, val_interval=1000)
    '''))
    proc = _python(lite_mmcv, f'''
        import runpy, sys
        sys.argv = ['train.py', {str(cfg)!r}, '--work-dir', {str(tmp_path / 'work')!r}]
        runpy.run_path({osp.join(tools, 'train.py')!r}, run_name='__main__')
    ''', hook=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert 'Epoch(train) [1][2/2]' in proc.stdout + proc.stderr
    assert 'mmcv-lite' not in proc.stderr


# ----------------------------------------------------------------------------------------------- set-up plan
@pytest.fixture(scope='module')
def plan_tool():
    return setup_plan


def _fake_bin(folder, name, script):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text('#!/bin/sh\n' + script)
    path.chmod(0o755)
    return path


def _fake_nvidia_smi(folder, *gpus):
    rows = ''.join(f'{i}, GPU-{i}aaaa-bbbb, {name}, {cap}\\n' for i, (name, cap) in enumerate(gpus))
    return _fake_bin(folder, 'nvidia-smi', f'printf "{rows}"\n')


def _fake_nvcc(folder, version, archs=('7.0', '8.0', '8.6', '9.0')):
    listed = ''.join(f'compute_{a.replace(".", "")}\\n' for a in archs)
    return _fake_bin(folder, 'nvcc', 'case "$1" in --list-gpu-arch) printf "' + listed + '";; '
                     f'*) echo "Cuda compilation tools, release {version}, V{version}.1";; esac\n')


PROBE = json.dumps(dict(torch='2.9.0', cuda='12.8'))


def _plan(plan_tool, tmp_path, **env):
    """The plan for the classic stack (mmcv 2.1.0, torch 2.9.0) unless ``STACK`` says otherwise."""
    base = dict(PATH=str(tmp_path / 'bin') + os.pathsep + '/usr/bin:/bin', VIT_PLUGIN_CACHE=str(tmp_path / 'cache'),
                VIT_PLUGIN_CUDA_PROBE=PROBE, CUDA_HOME=str(tmp_path / 'no_cuda'), STACK='classic')
    base.update(env)
    return plan_tool.make_plan(str(tmp_path / 'venv'), env={k: v for k, v in base.items() if v is not None})


def test_plan_default_is_mmcv_lite_even_with_a_gpu(plan_tool, tmp_path):
    _fake_nvidia_smi(tmp_path / 'bin', ('NVIDIA H100 80GB HBM3', '9.0'))
    plan = _plan(plan_tool, tmp_path)
    assert (plan['mode'], plan['action']) == ('lite', 'lite')
    assert 'CPU and CUDA 12.8 kernels' in plan_tool.describe(plan)


def test_plan_compiled_on_a_gpu_host_with_matching_nvcc(plan_tool, tmp_path):
    _fake_nvidia_smi(tmp_path / 'bin', ('NVIDIA H100 80GB HBM3', '9.0'), ('NVIDIA A100-SXM4-40GB', '8.0'))
    nvcc = _fake_nvcc(tmp_path / 'cuda' / 'bin', '12.4')
    plan = _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'cuda'))
    assert plan['action'] == 'build' and plan['archs'] == ['sm_80', 'sm_90']
    assert plan['key'] == 'torch-2.9.0-cu128-sm_80-sm_90'
    assert plan['cache_dir'] == str(tmp_path / 'cache' / 'wheels' / 'torch-2.9.0-cu128-sm_80-sm_90')
    assert plan['build_env'] == dict(MMCV_WITH_OPS='1', FORCE_CUDA='1', TORCH_CUDA_ARCH_LIST='8.0;9.0',
                                     CUDA_HOME=str(nvcc.parent.parent.resolve()))
    # only the GPUs CUDA_VISIBLE_DEVICES shows; TORCH_CUDA_ARCH_LIST wins over them
    assert _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'cuda'),
                 CUDA_VISIBLE_DEVICES='1')['archs'] == ['sm_80']
    explicit = _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'cuda'),
                     TORCH_CUDA_ARCH_LIST='8.6;9.0+PTX')
    assert explicit['key'] == 'torch-2.9.0-cu128-sm_86-sm_90+PTX'
    # an nvcc on PATH (no CUDA_HOME) is found too
    _fake_nvcc(tmp_path / 'bin', '12.8')
    assert _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=None)['nvcc']['version'] == '12.8'


def test_plan_stops_on_a_gpu_host_without_a_matching_nvcc(plan_tool, tmp_path):
    _fake_nvidia_smi(tmp_path / 'bin', ('NVIDIA H100 80GB HBM3', '9.0'))
    plan = _plan(plan_tool, tmp_path, MMCV_OPS='compiled')
    assert plan['action'] == 'stop'
    assert 'no nvcc' in plan['message'] and 'CUDA 12.8' in plan['message']
    # both ways forward: an nvcc of CUDA 12.x, or a wheel built elsewhere
    assert 'CUDA toolkit 12.x' in plan['message'] and 'MMCV_WHEEL=' in plan['message']
    _fake_nvcc(tmp_path / 'cuda11' / 'bin', '11.8')
    plan = _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'cuda11'))
    assert plan['action'] == 'stop' and 'nvcc 11.8' in plan['message'] and 'MMCV_WHEEL=' in plan['message']
    _fake_nvcc(tmp_path / 'old12' / 'bin', '12.0', archs=('8.0', '8.6'))
    plan = _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'old12'))
    assert plan['action'] == 'stop' and 'cannot compile for sm_90' in plan['message']


def test_plan_compiled_cpu_kernels_cache_and_keep(plan_tool, tmp_path):
    plan = _plan(plan_tool, tmp_path, MMCV_OPS='compiled')  # no nvidia-smi: no GPU
    assert (plan['action'], plan['key'], plan['build_env']) == ('build', 'torch-2.9.0-cpu',
                                                                dict(MMCV_WITH_OPS='1', FORCE_CUDA='0'))
    # a GPU with a CPU-only torch: CPU kernels
    _fake_nvidia_smi(tmp_path / 'bin', ('NVIDIA L4', '8.9'))
    cpu_torch = _plan(plan_tool, tmp_path, MMCV_OPS='compiled',
                      VIT_PLUGIN_CUDA_PROBE=json.dumps(dict(torch='2.9.0', cuda=None)))
    assert cpu_torch['key'] == 'torch-2.9.0-cpu' and 'CPU-only' in plan_tool.describe(cpu_torch)
    (tmp_path / 'bin' / 'nvidia-smi').unlink()
    # a cached wheel of this key and Python is installed, not rebuilt; one of another Python is not
    py = f'cp{sys.version_info[0]}{sys.version_info[1]}'
    key_dir = tmp_path / 'cache' / 'wheels' / 'torch-2.9.0-cpu'
    key_dir.mkdir(parents=True)
    (key_dir / 'mmcv-2.1.0-cp39-cp39-linux_x86_64.whl').write_text('')
    assert _plan(plan_tool, tmp_path, MMCV_OPS='compiled')['action'] == 'build'
    wheel = key_dir / f'mmcv-2.1.0-{py}-{py}-linux_x86_64.whl'
    wheel.write_text('')
    plan = _plan(plan_tool, tmp_path, MMCV_OPS='compiled')
    assert (plan['action'], plan['wheel']) == ('cached', str(wheel))
    # the virtualenv already has it: nothing to do, and without MMCV_OPS it stays compiled
    (tmp_path / 'venv').mkdir()
    record = dict(key='torch-2.9.0-cpu', torch='2.9.0', python=py, mmcv='2.1.0', wheel=str(wheel))
    (tmp_path / 'venv' / plan_tool.RECORD).write_text(json.dumps(record))
    assert _plan(plan_tool, tmp_path)['action'] == 'keep'
    assert _plan(plan_tool, tmp_path, MMCV_OPS='compiled')['action'] == 'keep'
    assert _plan(plan_tool, tmp_path, MMCV_OPS='lite')['action'] == 'lite'
    # a wheel from MMCV_WHEEL (key unknown) stays too, until torch changes or MMCV_OPS=compiled re-decides
    (tmp_path / 'venv' / plan_tool.RECORD).write_text(json.dumps(dict(record, key=None)))
    assert _plan(plan_tool, tmp_path)['action'] == 'keep'
    assert _plan(plan_tool, tmp_path, MMCV_OPS='compiled')['action'] == 'cached'
    newer_torch = json.dumps(dict(torch='2.10.0', cuda='12.8'))
    assert _plan(plan_tool, tmp_path, VIT_PLUGIN_CUDA_PROBE=newer_torch)['action'] == 'build'


def test_plan_mmcv_wheel_and_bad_requests(plan_tool, tmp_path):
    py = f'cp{sys.version_info[0]}{sys.version_info[1]}'
    built = tmp_path / 'elsewhere' / f'mmcv-2.1.0-{py}-{py}-linux_x86_64.whl'
    built.parent.mkdir()
    built.write_text('')
    (built.parent / 'build.json').write_text(json.dumps(dict(key='torch-2.9.0-cu128-sm_90', cuda='12.8',
                                                             archs=['sm_90'])))
    plan = _plan(plan_tool, tmp_path, MMCV_WHEEL=str(built))
    assert (plan['mode'], plan['action'], plan['wheel'], plan['archs']) == ('compiled', 'wheel', str(built), ['sm_90'])
    other = built.with_name('mmcv-2.1.0-cp39-cp39-linux_x86_64.whl')
    other.write_text('')
    assert 'built for cp39' in _plan(plan_tool, tmp_path, MMCV_WHEEL=str(other))['message']
    too_new = built.with_name(f'mmcv-2.2.0-{py}-{py}-linux_x86_64.whl')
    too_new.write_text('')
    assert '< 2.2' in _plan(plan_tool, tmp_path, MMCV_WHEEL=str(too_new))['message']
    assert 'no such file' in _plan(plan_tool, tmp_path, MMCV_WHEEL=str(tmp_path / 'nope.whl'))['message']
    assert "'lite'" in _plan(plan_tool, tmp_path, MMCV_OPS='fast')['message']
    _fake_nvidia_smi(tmp_path / 'bin', ('NVIDIA H100 80GB HBM3', '9.0'))
    _fake_nvcc(tmp_path / 'cuda' / 'bin', '12.8')
    bad = _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'cuda'), TORCH_CUDA_ARCH_LIST='sm90')
    assert bad['action'] == 'stop' and 'TORCH_CUDA_ARCH_LIST' in bad['message']


def test_plan_current_stack_builds_onedl_mmcv(plan_tool, tmp_path):
    """The current stack: onedl-mmcv without operators by default, compiled onedl-mmcv wheels on request,
    and an MMCV_WHEEL of the other stack's mmcv refused."""
    probe = json.dumps(dict(torch='2.15.0', cuda='13.2'))
    plan = _plan(plan_tool, tmp_path, STACK='current', VIT_PLUGIN_CUDA_PROBE=probe)
    assert (plan['action'], plan['lite_dist'], plan['mmcv']) == ('lite', 'onedl-mmcv', '2.3.6')
    assert 'install onedl-mmcv==2.3.6 (pure Python)' in plan_tool.describe(plan)
    compiled = _plan(plan_tool, tmp_path, STACK='current', VIT_PLUGIN_CUDA_PROBE=probe, MMCV_OPS='compiled')
    assert (compiled['action'], compiled['key'], compiled['source_dist']) == ('build', 'torch-2.15.0-cpu',
                                                                              'onedl-mmcv')
    py = f'cp{sys.version_info[0]}{sys.version_info[1]}'
    key_dir = tmp_path / 'cache' / 'wheels' / 'torch-2.15.0-cpu'
    key_dir.mkdir(parents=True)
    (key_dir / f'mmcv-2.1.0-{py}-{py}-linux_x86_64.whl').write_text('')  # the classic stack's: not this one
    assert _plan(plan_tool, tmp_path, STACK='current', VIT_PLUGIN_CUDA_PROBE=probe, MMCV_OPS='compiled')['action'] \
        == 'build'
    wheel = key_dir / f'onedl_mmcv-2.3.6-{py}-{py}-linux_x86_64.whl'
    wheel.write_text('')
    cached = _plan(plan_tool, tmp_path, STACK='current', VIT_PLUGIN_CUDA_PROBE=probe, MMCV_OPS='compiled')
    assert (cached['action'], cached['wheel']) == ('cached', str(wheel))
    upstream = key_dir / f'mmcv-2.1.0-{py}-{py}-linux_x86_64.whl'
    refused = _plan(plan_tool, tmp_path, STACK='current', VIT_PLUGIN_CUDA_PROBE=probe, MMCV_WHEEL=str(upstream))
    assert refused['action'] == 'stop' and 'not a compiled onedl-mmcv wheel' in refused['message']
    assert _plan(plan_tool, tmp_path, STACK='current', VIT_PLUGIN_CUDA_PROBE=probe, MMCV_WHEEL=str(wheel))['action'] \
        == 'wheel'
    with pytest.raises(ValueError, match='STACK=future'):
        _plan(plan_tool, tmp_path, STACK='future')


@pytest.mark.parametrize('stack, pythons, expected', [
    ('classic', ((3, 10), (3, 11), (3, 12)), dict(scipy=['1.15.3', '1.17.1', '1.17.1'],
                                                 setuptools=['65.5.0', '65.5.0', '80.8.0'],
                                                 torch=['2.9.0'] * 3, numpy=['1.26.4'] * 3)),
    ('current', ((3, 11), (3, 12), (3, 13)), dict(scipy=['1.17.1', '1.18.1', '1.18.1'], torch=['2.15.0'] * 3,
                                                 numpy=['2.2.6'] * 3, **{'onedl-mmcv': ['2.3.6'] * 3})),
])
def test_lock_resolves_per_python(plan_tool, stack, pythons, expected):
    """Each stack's lock: one version per package for each Python the stack supports."""
    pins = {v: plan_tool.read_lock(plan_tool.lock_path(stack), python_version=v) for v in pythons}
    for name, versions in expected.items():
        assert [pins[v][name] for v in pythons] == versions, name
    if stack == 'classic':
        assert all(pins[v]['mmcv-lite'] == '2.1.0' and pins[v]['torch-xla'] == '2.9.0' for v in pins)
        assert 'mmcv' not in pins[(3, 11)] and 'tomli' in pins[(3, 10)] and 'tomli' not in pins[(3, 11)]
    else:  # the forks only: an upstream distribution would put its files over a fork's
        assert not {'mmcv', 'mmcv-lite', 'mmengine', 'mmpretrain', 'mmdet', 'torch-xla'} & set(pins[(3, 12)])


def _setup_env(tmp_path, *args, **env):
    full = dict(os.environ, VENV=str(tmp_path / 'venv'), VIT_PLUGIN_CACHE=str(tmp_path / 'cache'),
                VIT_PLUGIN_CUDA_PROBE=PROBE, CUDA_HOME=str(tmp_path / 'no_cuda'), STACK='classic',
                PATH=str(tmp_path / 'bin') + os.pathsep + os.environ['PATH'])
    full.update(env)
    return subprocess.run(['bash', osp.join(REPO, 'tools', 'setup_env.sh'), *args], env=full, capture_output=True,
                          text=True, timeout=120)


def test_setup_env_plan_changes_nothing_and_the_gpu_stop_comes_first(tmp_path):
    """``setup_env.sh --plan`` prints the decision and creates nothing; a real run that must stop (a GPU,
    no matching nvcc) stops before creating the virtualenv."""
    _fake_nvidia_smi(tmp_path / 'bin', ('NVIDIA H100 80GB HBM3', '9.0'))
    _fake_nvcc(tmp_path / 'cuda' / 'bin', '12.8')
    proc = _setup_env(tmp_path, '--plan', MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'cuda'))
    assert proc.returncode == 0, proc.stderr
    assert 'compiled -> build' in proc.stdout and 'TORCH_CUDA_ARCH_LIST=9.0' in proc.stdout
    assert 'visible GPUs: 0: NVIDIA H100 80GB HBM3 (9.0)' in proc.stdout
    proc = _setup_env(tmp_path, '--plan')
    assert proc.returncode == 0 and 'lite -> lite' in proc.stdout
    stop = _setup_env(tmp_path, MMCV_OPS='compiled')
    assert stop.returncode == 1 and 'STOP: ' in stop.stderr and 'stopped before changing anything' in stop.stdout
    assert not (tmp_path / 'venv').exists() and not (tmp_path / 'cache').exists()


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
            tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=2e-2)
            torch.testing.assert_close(out_gpu.float().cpu(), out_cpu, **tol)
            torch.testing.assert_close(x_gpu.grad.float().cpu(), x_cpu.grad, **tol)


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
