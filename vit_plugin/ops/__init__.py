"""mmcv's compiled operators for an mmcv without them, and where this process's operators come from.

``python -m vit_plugin.ops`` prints the source and runs :func:`check`. See
docs/installation.md#where-mmcvs-operators-come-from."""
import ast
import glob
import importlib
import importlib.util
import json
import os.path as osp
import sys
import sysconfig

import _vit_plugin_mmcv_ext as _hook
from _vit_plugin_mmcv_ext import MissingCompiledOpError

from vit_plugin.compat import mmcv as mmcv_compat
from vit_plugin.compat import torchvision as torchvision_compat

__all__ = ['install', 'ops_source', 'describe', 'check', 'install_startup_hook', 'startup_hook_path',
           'mmcv_ext_names', 'MissingCompiledOpError', 'BUILD_RECORD']

#: Written into the environment (``sys.prefix``) by ``tools/setup_env.sh`` when it installs a compiled
#: mmcv: what the wheel was built for (torch, CUDA, GPU architectures).
BUILD_RECORD = 'vit_plugin_mmcv_build.json'

MMCV_MISSING = (
    "vit_plugin needs mmcv, and none is installed: pip install 'vit_plugin[onedl]' (onedl-mmcv, built "
    "without operators) or 'vit_plugin[openmmlab,lite]' (mmcv-lite 2.1.0); vit_plugin supplies NMS, RoIAlign "
    'and the sigmoid focal loss from torchvision. See docs/installation.md.')


def install():
    """Let ``import mmcv._ext`` find our operators when mmcv has none (idempotent); ImportError without mmcv."""
    if importlib.util.find_spec('mmcv') is None:
        raise ImportError(MMCV_MISSING)
    _hook.install()


def mmcv_ext_names(mmcv_root=None):
    """Every operator name mmcv's Python code asks ``mmcv._ext`` for, read from its sources (nothing imported)."""
    if mmcv_root is None:
        spec = importlib.util.find_spec('mmcv')
        if spec is None:
            raise ImportError(MMCV_MISSING)
        mmcv_root = spec.submodule_search_locations[0]
    names = set()
    for path in sorted(glob.glob(osp.join(mmcv_root, '**', '*.py'), recursive=True)):
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, 'attr', None) == 'load_ext' and len(node.args) == 2
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == '_ext'
                    and isinstance(node.args[1], (ast.List, ast.Tuple))):
                names.update(e.value for e in node.args[1].elts if isinstance(e, ast.Constant))
    return sorted(names)


def _build_record():
    path = osp.join(sys.prefix, BUILD_RECORD)
    if not osp.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def ops_source():
    """Where ``mmcv._ext`` comes from here: dict of ``kind`` ('provider', 'compiled' or 'missing'), ``file``,
    ``cuda``, ``archs`` (compiled mmcv's GPU architectures), ``library``, and ``error`` for 'missing'.
    """
    install()
    try:
        ext = mmcv_compat.import_ext()
    except ImportError as error:
        return dict(kind='missing', file=None, cuda=None, archs=None, library=None, error=str(error))
    import mmcv
    if getattr(ext, 'VIT_PLUGIN_PROVIDER', False):
        import torch
        import torchvision
        tv_cuda = torchvision_compat.cuda_version()  # e.g. 12080; -1 for a CPU-only torchvision
        cuda = f'{tv_cuda // 1000}.{tv_cuda % 1000 // 10}' if tv_cuda > 0 else None
        return dict(kind='provider', file=ext.__file__, cuda=cuda, archs=None,
                    library=f'torchvision {torchvision.__version__}', error=None)
    cuda = ext.get_compiling_cuda_version()
    cuda = None if cuda in ('not available', '', None) else str(cuda)
    record = _build_record()
    archs = None
    if record and record.get('mmcv') == mmcv.__version__ and record.get('cuda') == (cuda or 'cpu'):
        archs = record.get('archs') or None
    return dict(kind='compiled', file=ext.__file__, cuda=cuda, archs=archs, library=f'compiled mmcv {mmcv.__version__}',
                error=None)


def describe(source=None):
    """One line for logs, e.g. 'torchvision 0.24.0 (CPU, CUDA 12.8)'."""
    source = source or ops_source()
    if source['kind'] == 'missing':
        return f"none: `import mmcv._ext` fails ({source['error']})"
    parts = ['CPU']
    if source['cuda']:
        parts.append(f"CUDA {source['cuda']}")
        if source['archs']:
            parts.append(', '.join(source['archs']))
    where = 'via vit_plugin' if source['kind'] == 'provider' else mmcv_compat.EXT_MODULE
    return f"{source['library']} ({', '.join(parts)}; {where})"


def _run_once(device):
    """NMS, RoIAlign forward and backward through mmcv's wrappers on ``device``; returns the results."""
    import torch
    from mmcv.ops import nms, roi_align
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [20., 20., 30., 30.]], device=device)
    scores = torch.tensor([0.9, 0.8, 0.7], device=device)
    _, keep = nms(boxes, scores, 0.5)
    feature = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32, device=device).reshape(2, 3, 8, 8).requires_grad_()
    rois = torch.tensor([[0, 1., 1., 6., 5.], [1, 0.5, 2., 7.5, 7.5]], device=device)
    pooled = roi_align(feature, rois, (2, 2), 1.0, 2, 'avg', True)
    pooled.square().sum().backward()
    return keep.cpu(), pooled.detach().cpu(), feature.grad.cpu()


def check(devices=None):
    """Run NMS and RoIAlign (forward, backward) through mmcv's wrappers on the CPU and each GPU -> :func:`describe`
    plus the GPUs checked; RuntimeError, saying what to do, when operators are missing, fail or disagree.
    """
    import torch
    source = ops_source()
    if source['kind'] == 'missing':
        raise RuntimeError(f"mmcv's operators are missing: {source['error']}. Re-run the set-up "
                           '(`make setup`), or see docs/installation.md.')
    if devices is None:
        devices = ['cpu'] + [f'cuda:{i}' for i in range(torch.cuda.device_count())]
    reference = _run_once('cpu')
    if not torch.equal(reference[0], torch.tensor([0, 2])):
        raise RuntimeError(f'NMS kept {reference[0].tolist()} instead of [0, 2] on the CPU ({describe(source)})')
    checked = []
    for device in devices:
        if device == 'cpu':
            continue
        try:
            results = _run_once(device)
        except RuntimeError as error:
            hint = ('the compiled mmcv has no CUDA kernels, or none for this GPU: rebuild it on this host with '
                    '`MMCV_OPS=compiled make setup`, or use the default set-up (torchvision kernels)'
                    if source['kind'] == 'compiled' else 'check that torch and torchvision are CUDA builds of '
                    'matching versions (requirements/<stack>/lock.txt)')
            raise RuntimeError(f'NMS / RoIAlign failed on {device} ({describe(source)}): {error}. {hint}.') from error
        for name, got, want in zip(('NMS', 'RoIAlign', 'RoIAlign gradient'), results, reference):
            if got.shape != want.shape or not torch.allclose(got.to(want.dtype), want, rtol=1e-5, atol=1e-5):
                raise RuntimeError(f'{name} on {device} differs from the CPU result ({describe(source)})')
        major, minor = torch.cuda.get_device_capability(device)
        checked.append(f'sm_{major}{minor} ({torch.cuda.get_device_name(device)})')
    line = describe(source)
    if checked:
        line += '; ran on ' + ', '.join(checked)
    return line


def startup_hook_path(site_dir=None):
    """Where :func:`install_startup_hook` writes the ``.pth`` (default: this interpreter's site-packages)."""
    return osp.join(site_dir or sysconfig.get_paths()['purelib'], _hook.PTH_NAME)


def install_startup_hook(site_dir=None):
    """Write the ``.pth`` that installs the ``mmcv._ext`` lookup at interpreter start (idempotent); returns its path."""
    return _hook.write_startup_file(site_dir or sysconfig.get_paths()['purelib'])
