#!/usr/bin/env python
"""A wheelhouse for a machine that has torch but no network: ``make wheelhouse``, then ``make gpu-report``.

    python requirements/make_wheelhouse.py build [--out wheelhouse] [--binary-under 12] [--python-version 3.11]
    python requirements/make_wheelhouse.py venv [--wheelhouse wheelhouse] [--venv .venv] [--host-site DIR]
    python requirements/make_wheelhouse.py host-site --out DIR

``build`` (on a machine with the project's environment and access to PyPI) collects, as wheels, every
package the stack needs at run time -- mmengine, mmcv, mmpretrain, mmdet (the forks on the current
stack, the upstream releases and mmcv-lite on the classic one; onedl-mmcv as the pure wheel the set-up
built), timm, pytest and
pytest-xdist (the report runs the ``cuda`` tests; ``make test`` runs test files in parallel) with their
dependencies, at the versions of the running environment -- except what comes with torch and
torchvision (torch's own requirements, numpy, pillow). Pure-Python
wheels work on any host. Compiled ones are platform- and Python-specific: those smaller than
``--binary-under`` MiB (matplotlib, pyyaml, pycocotools, shapely...) are taken for the Python version
and platform given (default: this interpreter's); the large ones (OpenCV, SciPy) would make the
wheelhouse too big to copy and are left to the host, listed in ``host-requirements.txt``. A wheel of
vit_plugin itself completes it. The wheelhouse must stay under 64 MiB.

``venv`` (on the host, with its Python that has torch) makes ``--venv`` that sees, after its own
packages, the host's torch, torchvision and compiled packages (NumPy, Pillow, OpenCV, SciPy, llvmlite,
scikit-image, whichever are installed, with what they require) linked into ``VENV/host-site``, and no
other host package; it installs the wheelhouse into it with ``pip --no-index --no-deps`` (every
dependency is in the list already, and pip must not refuse e.g. a host's ``opencv-python-headless``
for mmcv's ``opencv-python``) and checks that the stack imports. ``--host-site DIR`` uses a folder
made beforehand instead; ``host-site`` makes one from the running environment, which is how the
wheelhouse is checked on a machine without such a host.
"""
import argparse
import importlib.metadata as metadata
import json
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: Distributions each stack needs at run time (the report: training, detection, the cuda tests); the
#: environment running ``build`` says which stack it is.
ROOTS = {
    'current': ['onedl-mmengine', 'onedl-mmcv', 'onedl-mmpretrain', 'onedl-mmdetection', 'timm', 'pytest',
                'pytest-xdist'],
    'classic': ['mmengine', 'mmcv-lite', 'mmpretrain', 'mmdet', 'timm', 'pytest', 'pytest-xdist'],
}
#: onedl-mmcv is published as source only; the set-up builds it as a pure wheel and keeps it here.
PURE_WHEELS = osp.join(os.environ.get('VIT_PLUGIN_CACHE') or osp.join(osp.expanduser('~'), '.cache', 'vit_plugin'),
                       'wheels', 'pure')
#: What the host brings with its torch; their requirement closure is left out too.
HOST = ['torch', 'torchvision']
LIMIT_MIB = 64
#: Modules a usable host must import (the compiled packages the wheelhouse leaves to it).
HOST_MODULES = {'torch': 'torch', 'torchvision': 'torchvision', 'numpy': 'numpy', 'PIL': 'pillow',
                'cv2': 'opencv-python (or opencv-python-headless)', 'scipy': 'scipy'}


def _canonical(name: str) -> str:
    return re.sub(r'[-_.]+', '-', name).lower()


def _installed():
    return {_canonical(d.metadata['Name']): d for d in metadata.distributions()}


def _requirements(dist):
    from packaging.requirements import Requirement
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({'extra': ''}):
            yield _canonical(req.name)


def _stack(dists) -> str:
    return 'current' if 'onedl-mmengine' in dists else 'classic'


def _mmcv_lite_pin() -> str:
    path = osp.join(REPO, 'requirements', 'classic', 'mmcv_lite.txt')
    if osp.isfile(path):
        with open(path) as f:
            for line in f:
                match = re.match(r'\s*mmcv-lite==(\S+)', line)
                if match:
                    return match.group(1)
    return metadata.version('mmcv') if _canonical('mmcv') in _installed() else '2.1.0'


def closure(roots, dists):
    """Names and versions of ``roots`` and everything they require, from the installed metadata.

    ``mmcv-lite`` stands for mmcv's Python code: where a compiled ``mmcv`` is installed instead, its
    requirements are read and the pin of requirements/mmcv_lite.txt is used.
    """
    found, stack, missing = {}, [_canonical(r) for r in roots], []
    while stack:
        name = stack.pop()
        if name == 'mmcv' and 'onedl-mmcv' not in dists:  # mmcv's Python code, whichever distribution has it
            name = 'mmcv-lite'
        if name in found:
            continue
        dist = dists.get(name)
        if dist is None and name == 'mmcv-lite':
            dist, version = dists.get('mmcv'), _mmcv_lite_pin()
        else:
            version = dist.version if dist is not None else None
        if dist is None:
            missing.append(name)
            continue
        found[name] = version
        stack.extend(_requirements(dist))
    if missing:
        raise SystemExit(f'make_wheelhouse: {", ".join(sorted(set(missing)))} not installed in {sys.prefix}; '
                         f'run it with the project environment (`make wheelhouse` uses .venv).')
    return found


def _pure(dist) -> bool:
    wheel = dist.read_text('WHEEL') or ''
    return any(tag.endswith('-none-any') for tag in re.findall(r'Tag:\s*(\S+)', wheel))


def _pip_download(spec: str, dest: str, python_version: str, platforms, pure: bool) -> bool:
    cmd = [sys.executable, '-m', 'pip', 'download', '--disable-pip-version-check', '-q', '--no-deps',
           '--only-binary=:all:', '--python-version', python_version, '-d', dest, spec]
    if pure:
        cmd += ['--platform', 'any', '--implementation', 'py', '--abi', 'none']
    else:
        for platform in platforms:
            cmd += ['--platform', platform]
    return subprocess.run(cmd, capture_output=True, text=True).returncode == 0


def _pip_build_pure(spec: str, dest: str) -> bool:
    """Builds ``spec`` from its source package in pip's isolated build environment (which has no torch,
    so mmcv's operators are not compiled); True when that gives a pure wheel."""
    cmd = [sys.executable, '-m', 'pip', 'wheel', '--disable-pip-version-check', '-q', '--no-deps', '-w', dest, spec]
    if subprocess.run(cmd, capture_output=True, text=True).returncode != 0:
        return False
    built = os.listdir(dest) if osp.isdir(dest) else []
    return len(built) == 1 and built[0].endswith('-none-any.whl')


def _platforms():
    """Platform tags of this interpreter, most specific first (manylinux on Linux)."""
    from packaging import tags
    seen = []
    for tag in tags.sys_tags():
        if tag.platform not in seen and tag.platform != 'any':
            seen.append(tag.platform)
    return seen[:40]


def _mib(path: str) -> float:
    return osp.getsize(path) / 2**20


def build(args) -> dict:
    dists = _installed()
    host = closure(HOST, dists) if all(_canonical(h) in dists for h in HOST) else {}
    needed = {n: v for n, v in closure(ROOTS[_stack(dists)], dists).items()
              if n not in host and n not in ('torch', 'torchvision')}
    os.makedirs(args.out, exist_ok=True)
    for name in os.listdir(args.out):  # a fresh set: no wheel of an older pin stays behind
        if name.endswith('.whl') or name.endswith('.txt'):
            os.remove(osp.join(args.out, name))
    platforms = args.platform or _platforms()
    wheels, left = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, version in sorted(needed.items()):
            dest = osp.join(tmp, name)
            spec = f'{name}=={version}'
            built = osp.join(PURE_WHEELS, f"{name.replace('-', '_')}-{version}-py3-none-any.whl")
            if osp.isfile(built):  # a source-only package the set-up built as a pure wheel
                os.makedirs(dest)
                shutil.copy(built, dest)
                kind = 'pure'
            elif _pip_download(spec, dest, args.python_version, platforms, pure=True):
                kind = 'pure'
            elif _pip_download(spec, dest, args.python_version, platforms, pure=False):
                kind = 'compiled'
            elif _pip_build_pure(spec, dest):  # published as source only (the onedl forks)
                kind = 'pure'
            else:
                raise SystemExit(f'make_wheelhouse: pip found no wheel of {spec} for Python {args.python_version} '
                                 f'({", ".join(platforms[:3])}...); is PyPI reachable?')
            path = osp.join(dest, os.listdir(dest)[0])
            if kind == 'compiled' and _mib(path) > args.binary_under:
                left[name] = (version, _mib(path))
                continue
            shutil.move(path, osp.join(args.out, osp.basename(path)))
            wheels[name] = (version, kind, _mib(osp.join(args.out, osp.basename(path))))
    # vit_plugin itself: a pure wheel of this checkout (with its mmcv._ext start-up hook).
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--disable-pip-version-check', '-q', '--no-deps',
                        '--no-build-isolation', '-w', tmp, REPO], check=True)
        built, = os.listdir(tmp)
        shutil.move(osp.join(tmp, built), osp.join(args.out, built))
        wheels['vit-plugin'] = (built.split('-')[1], 'pure', _mib(osp.join(args.out, built)))
    with open(osp.join(args.out, 'requirements.txt'), 'w') as f:
        f.write('# Installed with `python requirements/make_wheelhouse.py venv` (pip --no-index --no-deps).\n')
        f.writelines(f'{name}=={version}\n' for name, (version, _, _) in sorted(wheels.items()))
    with open(osp.join(args.out, 'host-requirements.txt'), 'w') as f:
        f.write('# Not in the wheelhouse: the host provides these (compiled, too large to copy, or torch\'s own).\n'
                '# Tested versions; `requirements/make_wheelhouse.py venv` checks that they import.\n')
        f.writelines(f'{name}=={version}  # {size:.0f} MiB wheel\n' for name, (version, size) in sorted(left.items()))
        f.writelines(f'{name}=={version}  # with torch/torchvision\n' for name, version in sorted(host.items())
                     if not name.startswith('nvidia-'))
    total = sum(_mib(osp.join(args.out, n)) for n in os.listdir(args.out))
    summary = dict(out=args.out, wheels=len(wheels), pure=sum(k == 'pure' for _, k, _ in wheels.values()),
                   compiled=sorted(n for n, (_, k, _) in wheels.items() if k == 'compiled'),
                   left_to_host=sorted(left), mib=round(total, 1), python=args.python_version)
    with open(osp.join(args.out, 'wheelhouse.json'), 'w') as f:
        json.dump(dict(summary, files={n: dict(version=v, kind=k, mib=round(s, 2)) for n, (v, k, s) in wheels.items()}),
                  f, indent=1)
    print(f"wheelhouse: {summary['wheels']} wheels ({summary['pure']} pure; compiled for Python {args.python_version}: "
          f"{', '.join(summary['compiled']) or 'none'}), {total:.1f} MiB in {args.out}; left to the host: "
          f"{', '.join(f'{n} ({s:.0f} MiB)' for n, (_, s) in sorted(left.items())) or 'nothing'} and torch's own")
    if total > LIMIT_MIB:
        raise SystemExit(f'make_wheelhouse: {total:.1f} MiB is over {LIMIT_MIB} MiB; lower --binary-under.')
    return summary


# ------------------------------------------------------------------------------------------ venv
CHECK = """
import importlib, sys
missing = []
for module, what in {modules!r}.items():
    try:
        importlib.import_module(module)
    except ImportError as err:
        missing.append(f'{{what}} ({{err}})')
if missing:
    sys.exit('the host lacks: ' + '; '.join(missing))
import mmcv, mmdet, mmengine, mmpretrain, numpy, torch, vit_plugin
import mmdet.models, mmpretrain.models, mmcv.ops
from vit_plugin.ops import describe
print(f'stack ok: torch {{torch.__version__}}, numpy {{numpy.__version__}}, mmengine {{mmengine.__version__}}, '
      f'mmcv {{mmcv.__version__}}, mmpretrain {{mmpretrain.__version__}}, mmdet {{mmdet.__version__}}; '
      f"mmcv's operators: {{describe()}}")
"""


#: What the venv takes from the host besides torch and torchvision (those installed there, with what they
#: require): the compiled packages the wheelhouse leaves out.
HOST_EXTRAS = ['numpy', 'pillow', 'opencv-python', 'opencv-python-headless', 'scipy', 'llvmlite', 'scikit-image']


def venv(args) -> None:
    wheelhouse = osp.abspath(args.wheelhouse)
    requirements = osp.join(wheelhouse, 'requirements.txt')
    if not osp.isfile(requirements):
        raise SystemExit(f'make_wheelhouse venv: {requirements} not found; run `make wheelhouse` on a machine with '
                         f'network access and copy the folder here.')
    # Not --system-site-packages: a host's environment often holds packages the stack cannot use (a
    # transformers 5 that mmpretrain's multimodal models break on, the huggingface_hub it needs), and it
    # may itself be a virtual environment, whose packages --system-site-packages would not reach. The
    # venv sees the host's torch, torchvision and compiled packages only, linked into one folder.
    host = osp.abspath(args.host_site or osp.join(args.venv, 'host-site'))
    if not args.host_site:
        shutil.rmtree(host, ignore_errors=True)
        link_host_packages(HOST + HOST_EXTRAS, host)
    if not osp.isfile(osp.join(args.venv, 'bin', 'python')):
        subprocess.run([sys.executable, '-m', 'venv', args.venv], check=True)
    # absolute: the import check runs in a temporary folder, away from this checkout's vit_plugin
    python = osp.abspath(osp.join(args.venv, 'bin', 'python'))
    purelib = subprocess.run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                             capture_output=True, text=True, check=True).stdout.strip()
    with open(osp.join(purelib, '_host_site_packages.pth'), 'w') as f:  # after the venv's own packages
        f.write(host + '\n')
    subprocess.run([python, '-m', 'pip', 'install', '--disable-pip-version-check', '-q', '--no-index', '--no-deps',
                    '--find-links', wheelhouse, '-r', requirements], check=True)
    check = subprocess.run([python, '-c', CHECK.format(modules=HOST_MODULES)], capture_output=True, text=True,
                           cwd=tempfile.gettempdir())
    if check.returncode != 0:
        listed = osp.join(wheelhouse, 'host-requirements.txt')
        raise SystemExit(f'make_wheelhouse venv: {args.venv} does not import the stack:\n{check.stderr[-3000:]}\n'
                         f'{listed} lists what the host must provide.')
    print(check.stdout.strip())


def link_host_packages(packages, out: str) -> None:
    """Links those of ``packages`` installed beside this Python, and what they require, into ``out``: a
    host's site-packages reduced to what the stack takes from it."""
    dists = _installed()
    names = closure([p for p in packages if _canonical(p) in dists], dists)
    os.makedirs(out, exist_ok=True)
    linked = set()
    for name in names:
        dist = dists[name]
        for file in dist.files or []:
            top = file.parts[0]
            if top in linked or top.endswith('.pth') or top == '..' or top == '__pycache__':
                continue
            source = osp.join(str(dist.locate_file('')), top)
            if osp.exists(source):
                os.symlink(source, osp.join(out, top))
                linked.add(top)
    print(f'host-site: {len(names)} distributions ({", ".join(sorted(n for n in names if not n.startswith("nvidia")))} '
          f'and the nvidia libraries) linked into {out}')


def host_site(args) -> None:
    """A stand-in for a CUDA host's site-packages, to check the wheelhouse on a machine that has none."""
    link_host_packages(args.packages, args.out)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    sub = parser.add_subparsers(dest='command')
    b = sub.add_parser('build', help='collect the wheels (needs PyPI)')
    b.add_argument('--out', default='wheelhouse')
    b.add_argument('--binary-under', type=float, default=12.,
                   help='compiled wheels up to this many MiB go in; larger ones are left to the host (default 12)')
    b.add_argument('--python-version', default='.'.join(map(str, sys.version_info[:2])),
                   help="the host's Python for compiled wheels (default: this interpreter's)")
    b.add_argument('--platform', nargs='+', default=None, help='platform tags for compiled wheels (default: this '
                   "machine's, e.g. manylinux_2_28_x86_64)")
    v = sub.add_parser('venv', help="make a venv from the wheelhouse beside the host's torch")
    v.add_argument('--wheelhouse', default='wheelhouse')
    v.add_argument('--venv', default='.venv')
    v.add_argument('--host-site', default=None,
                   help="a directory with the host's packages (torch...), instead of this Python's own site-packages")
    h = sub.add_parser('host-site', help="links to this environment's torch, torchvision, OpenCV and SciPy: a "
                       'stand-in host for checking the wheelhouse')
    h.add_argument('--out', required=True)
    h.add_argument('--packages', nargs='+', default=HOST + ['opencv-python', 'scipy'])
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(['build', *(argv or sys.argv[1:])])
    return args


def main(argv=None):
    args = parse_args(argv)
    return {'build': build, 'venv': venv, 'host-site': host_site}[args.command](args)


if __name__ == '__main__':
    main()
