"""The ``mmcv._ext`` provider (``vit_plugin.ops.ext``) on a copy of mmcv without its compiled extension
(what mmcv-lite installs): every import order, with and without the start-up hook, the hook in a wheel,
and mmdet's / mmpretrain's own tools/train.py with ``custom_imports``.

Every interpreter imports the whole stack (seconds each), so the orders that a tool's own run already
takes are checked in that run: mmdet first with the hook in mmdet's tools/test.py, vit_plugin first
without it in both tools/train.py runs."""
import importlib.util
import os
import os.path as osp
import shutil
import subprocess
import sys
import textwrap

import mmcv.ops  # noqa: F401  (the pinned stack: a missing mmcv fails the module)
import pytest

import vit_plugin.ops as ops
import vit_plugin.ops.ext as provider
from helpers.common import HELPERS, REPO


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


def _assert_works(proc, case):
    """``proc`` ran WORKS: the provider served mmcv._ext, and mmcv never warned 'install mmcv rather than
    mmcv-lite'."""
    assert proc.returncode == 0, (case, proc.stderr[-3000:])
    assert 'works: ' + provider.__file__ in proc.stdout, (case, proc.stdout[-2000:])
    assert 'mmcv-lite' not in proc.stderr, (case, proc.stderr[-2000:])


def test_any_import_order_works(lite_mmcv, tmp_path):
    """With the start-up hook (every install has it) any of vit_plugin, mmcv.ops and mmdet.models may come
    first, and mmcv's 'install mmcv rather than mmcv-lite' warning never appears. Without it (vit_plugin
    only on PYTHONPATH, or VIT_PLUGIN_OPS_HOOK=0) importing vit_plugin first works, and mmcv.ops first
    fails at once on the missing module (the docs say what to do). A compiled mmcv._ext, when there is one,
    is found before the hook's finder. One interpreter per case, all at once; mmdet.models first with the
    hook, and vit_plugin first without it, are the runs of the tools' tests below."""
    modules = ('vit_plugin', 'mmcv.ops', 'mmdet.models')
    cases = {(True, first): ''.join(f'import {m}\n' for m in [first] + [m for m in modules if m != first]) + WORKS
             for first in modules[:2]}
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
    results = {case: subprocess.CompletedProcess(proc.args, proc.wait(timeout=600), *proc.communicate())
               for case, proc in procs.items()}
    for case, proc in results.items():
        if case == (False, 'mmcv.ops'):
            assert proc.returncode != 0 and "No module named 'mmcv._ext'" in proc.stderr, proc.stderr[-3000:]
            continue
        _assert_works(proc, case)


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
    mmcv-lite. train.py reads the config before it reaches mmcv.ops, so it needs no start-up hook: its
    custom_imports bring vit_plugin first. test.py imports mmdet.evaluation (and with it mmcv.ops) first, so
    it relies on the hook; here mmdet.models comes even before it. Each run ends with the import-order
    check of the test above (WORKS)."""
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
    train = _python(lite_mmcv, textwrap.dedent(f'''
        import runpy, sys
        sys.argv = ['train.py', {str(cfg)!r}, '--work-dir', {str(work)!r}]
        runpy.run_path({osp.join(tools, 'train.py')!r}, run_name='__main__')
    ''') + WORKS, hook=False)
    _assert_works(train, (False, 'vit_plugin'))
    assert (work / 'epoch_1.pth').is_file()
    test = _python(lite_mmcv, textwrap.dedent(f'''
        import mmdet.models
        import runpy, sys
        sys.argv = ['test.py', {str(cfg)!r}, {str(work / 'epoch_1.pth')!r}, '--work-dir', {str(work)!r}]
        runpy.run_path({osp.join(tools, 'test.py')!r}, run_name='__main__')
    ''') + WORKS, hook=True)
    _assert_works(test, (True, 'mmdet.models'))
    assert 'coco/bbox_mAP' in test.stdout + test.stderr


@pytest.mark.slow
def test_mmpretrains_own_train_tool_with_custom_imports(lite_mmcv, tmp_path, digits_root):
    """mmpretrain's tools/train.py on a ViT classification config (custom_imports only, no start-up hook):
    two iterations, and no 'install mmcv rather than mmcv-lite' warning from mmcv's transformer bricks; then
    the import-order check of the first test (WORKS)."""
    tools = osp.join(osp.dirname(importlib.util.find_spec('mmpretrain').origin), '.mim', 'tools')
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(textwrap.dedent(f'''
        _base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
        model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=1, num_heads=2, mlp_dims=32)),
                     head=dict(in_channels=32))
        train_dataloader = dict(batch_size=16, num_workers=0, dataset=dict(data_root={digits_root!r}, indices=32))
        val_dataloader = dict(dataset=dict(data_root={digits_root!r}, indices=16))
        test_dataloader = val_dataloader
        train_cfg = dict(max_epochs=1, val_interval=1000)
    '''))
    proc = _python(lite_mmcv, textwrap.dedent(f'''
        import runpy, sys
        sys.argv = ['train.py', {str(cfg)!r}, '--work-dir', {str(tmp_path / 'work')!r}]
        runpy.run_path({osp.join(tools, 'train.py')!r}, run_name='__main__')
    ''') + WORKS, hook=False)
    _assert_works(proc, (False, 'vit_plugin'))
    assert 'Epoch(train) [1][2/2]' in proc.stdout + proc.stderr
