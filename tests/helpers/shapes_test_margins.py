"""Margins of the shapes detection test's bars on learned behaviour, over seeds and CPU kernel sets.

The ``shapes_run`` of ``tests/configs/test_detection_configs.py`` trains a tiny Mask R-CNN for ``EPOCHS``
epochs of 16 iterations and asserts whole-validation-set numbers (loss ratio, bbox / segm mAP_50, recall,
precision and share of images with a detection at score 0.5 in tools/infer.py, and the untrained model's
mAP_50). Float rounding differs between CPUs (AVX-512, AVX2, no vector kernels), so each bar must
hold with a margin on all of them. This runs the test's recipe (``shapes_training_run`` of
``tests/helpers/shapes_detection.py``) once per seed and ``ATEN_CPU_CAPABILITY`` value, each in its own
process, and prints every run and the worst value next to the test's bar.

    OMP_NUM_THREADS=1 .venv/bin/python tests/helpers/shapes_test_margins.py --seeds 0 1 2 --capabilities avx2 default

``--break-roi-stride`` runs a deliberately broken detector (the RoI extractors read each level at twice its
stride, so the RoI heads pool features of the wrong places) to show that the bars catch it; ``--epochs``
measures another training length.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import tempfile

TESTS = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, TESTS)  # shared test code imports as helpers.<module>, as in the tests

from helpers import shapes_detection as t  # noqa: E402

REPO = osp.dirname(TESTS)
BROKEN = {'model.roi_head.bbox_roi_extractor.featmap_strides': [8, 16, 32, 64],
          'model.roi_head.mask_roi_extractor.featmap_strides': [8, 16, 32, 64]}

CHILD = '''
import json
import torch
torch.set_num_threads({threads})
from helpers.shapes_detection import shapes_training_run
run = shapes_training_run(__import__('pathlib').Path({work!r}), seed={seed}, epochs={epochs}, **{overrides!r})
print('RESULT ' + json.dumps(dict(run, losses=None)))
'''


def _launch(seed, capability, threads, epochs, overrides, work):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               PYTHONPATH=os.pathsep.join([REPO, TESTS, osp.join(TESTS, 'helpers')]))
    env.pop('PJRT_DEVICE', None)
    if capability:
        env['ATEN_CPU_CAPABILITY'] = capability
    code = CHILD.format(threads=threads, work=work, seed=seed, epochs=epochs, overrides=overrides)
    return subprocess.Popen([sys.executable, '-c', code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--capabilities', nargs='+', default=['avx2', 'default'],
                        help="ATEN_CPU_CAPABILITY values ('native': leave it unset)")
    parser.add_argument('--threads', type=int, default=1, help='torch threads per run')
    parser.add_argument('--jobs', type=int, default=2, help='runs at a time')
    parser.add_argument('--epochs', type=int, default=t.EPOCHS, help='training epochs of 16 iterations')
    parser.add_argument('--break-roi-stride', action='store_true', help='a broken detector instead (see above)')
    parser.add_argument('--out', help='write the runs as JSON')
    args = parser.parse_args(argv)
    overrides = BROKEN if args.break_roi_stride else {}
    pending = [(s, c) for c in args.capabilities for s in args.seeds]
    runs, running = [], []
    with tempfile.TemporaryDirectory() as tmp:
        while pending or running:
            while pending and len(running) < args.jobs:
                seed, cap = pending.pop(0)
                work = osp.join(tmp, f'{cap}_{seed}')
                capability = None if cap == 'native' else cap
                running.append((seed, cap, _launch(seed, capability, args.threads, args.epochs, overrides, work)))
            seed, cap, proc = running.pop(0)
            out, err = proc.communicate()
            line = [row for row in out.splitlines() if row.startswith('RESULT ')]
            if proc.returncode or not line:
                raise SystemExit(f'seed {seed}, {cap}: failed\n{err[-3000:]}')
            runs.append(dict(seed=seed, capability=cap, **json.loads(line[0][7:])))
            print(_row(runs[-1]), flush=True)
    bars = [('loss_ratio', max, t.LOSS_RATIO_MAX, '<'), ('coco/bbox_mAP_50', min, t.BBOX_MAP50_MIN, '>='),
            ('coco/segm_mAP_50', min, t.SEGM_MAP50_MIN, '>='), ('recall', min, t.RECALL_MIN, '>='),
            ('precision', min, t.PRECISION_MIN, '>='), ('drawn_share', min, t.DRAWN_SHARE_MIN, '>='),
            ('baseline bbox_mAP_50', max, t.BASELINE_MAP50_MAX, '<'),
            ('baseline segm_mAP_50', max, t.BASELINE_MAP50_MAX, '<')]
    print('\nworst of', len(runs), 'runs (bar in the test):')
    for key, worst, bar, op in bars:
        value = worst(_value(r, key) for r in runs)
        holds = value < bar if op == '<' else value >= bar
        print(f'  {key:22s} {value:.3f}  (test: {op} {bar})  {"holds" if holds else "FAILS"}')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(runs, f, indent=1)


def _value(run, key):
    if key.startswith('coco/'):
        return run['metrics'][key]
    if key.startswith('baseline '):
        return run['baseline']['coco/' + key.split(' ')[1]]
    return run[key]


def _row(run):
    m, c = run['metrics'], run['inference']
    base = run['baseline']
    return (f"seed {run['seed']} {run['capability']:8s} loss ratio {run['loss_ratio']:.3f}  "
            f"bbox mAP {m['coco/bbox_mAP']:.3f} mAP_50 {m['coco/bbox_mAP_50']:.3f}  "
            f"segm mAP_50 {m['coco/segm_mAP_50']:.3f}  "
            f"recall {run['recall']:.3f} ({c['found']}/{c['shapes']})  precision {run['precision']:.3f} "
            f"({c['right']}/{c['detections']})  drawn {c['images_with_detections']}/{c['images']}  "
            f"untrained mAP_50 {base['coco/bbox_mAP_50']:.3f} / {base['coco/segm_mAP_50']:.3f}")


if __name__ == '__main__':
    main()
