"""``tools/infer.py`` (``vit_plugin.cli.infer``) on a demo classifier trained for 20 epochs: the top-1
names of the held-out test split (the images tools/test.py evaluates) are mostly right, top-k is
ordered, folders are searched, image files keep the order given, and a missing file is named.

One training run, shared by the tests below; each test checks one claim."""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest

from helpers.common import REPO, run_env
from vit_plugin.cli.infer import main as infer

pytestmark = pytest.mark.slow

EPOCHS = 20


@pytest.fixture(scope='module')
def trained(tmp_path_factory, digits_root):
    """The demo config trained for 20 epochs: (config, checkpoint, the digits' test folder)."""
    tmp_path = tmp_path_factory.mktemp('infer')
    cfg = tmp_path / 'demo.py'
    cfg.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
max_epochs = {EPOCHS}
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, end_factor=1.0, by_epoch=True, begin=0, end=2, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=2, end=max_epochs, convert_to_iter_based=True)]
train_cfg = dict(max_epochs=max_epochs, val_interval=100)
train_dataloader = dict(dataset=dict(data_root={digits_root!r}))
val_dataloader = dict(dataset=dict(data_root={digits_root!r}))
test_dataloader = val_dataloader
default_hooks = dict(checkpoint=dict(interval={EPOCHS}))
""")
    work = tmp_path / 'work'
    proc = subprocess.run([sys.executable, osp.join(REPO, 'tools', 'train.py'), str(cfg), '--work-dir', str(work)],
                          env=run_env(), capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(cfg), str(work / f'epoch_{EPOCHS}.pth'), osp.join(digits_root, 'test')


@pytest.fixture(scope='module')
def predicted(trained, tmp_path_factory):
    """Top-3 predictions for the whole test split, given as its ten class folders: (the images in the
    order the folders list them, the results, the --out file)."""
    cfg, ckpt, test_root = trained
    folders = [osp.join(test_root, str(c)) for c in range(10)]
    images = [osp.join(f, name) for f in folders for name in sorted(os.listdir(f))]
    out = tmp_path_factory.mktemp('pred') / 'pred.json'
    results = infer([cfg, ckpt, *folders, '--topk', '3', '--batch-size', '16', '--out', str(out)])
    return images, results, out


def test_infer_results_follow_the_images_and_are_written_with_out(predicted):
    images, results, out = predicted
    assert [r['image'] for r in results] == images and json.loads(out.read_text()) == results


def test_infer_names_the_digits_of_a_trained_classifier(predicted):
    _, results, _ = predicted
    wrong = [(r['image'], r['topk'][0]) for r in results
             if r['topk'][0]['name'] != osp.basename(osp.dirname(r['image']))]
    print(f'tools/infer.py: {len(results) - len(wrong)} of {len(results)} test digits named right')
    # A whole-split share, not a handful of images: float rounding differs between CPU kernel sets, and a
    # few images near the decision boundary change their name from one set to another. The bar sits one
    # measured spread below the worst seed and kernel set (docs/development.md#tests).
    assert 1 - len(wrong) / len(results) >= 0.88, wrong


def test_infer_topk_is_ordered_and_names_the_classes(predicted):
    _, results, _ = predicted
    for r in results:
        scores = [e['score'] for e in r['topk']]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True) and sum(scores) <= 1 + 1e-6
        assert {e['name'] for e in r['topk']} <= {str(i) for i in range(10)}


def test_infer_keeps_the_order_of_image_files(trained, predicted):
    cfg, ckpt, _ = trained
    picked = predicted[0][::-40]  # image files named one by one come back in the order given, not sorted
    assert [r['image'] for r in infer([cfg, ckpt, *picked, '--topk', '1'])] == picked


def test_infer_searches_a_folder(trained):
    cfg, ckpt, test_root = trained
    folder = infer([cfg, ckpt, osp.join(test_root, '7'), '--topk', '1'])
    assert len(folder) == len(os.listdir(osp.join(test_root, '7')))
    assert sum(r['topk'][0]['name'] == '7' for r in folder) >= 0.85 * len(folder)


def test_infer_names_a_missing_file(trained, tmp_path):
    cfg, ckpt, _ = trained
    with pytest.raises(SystemExit, match='no such file or folder'):
        infer([cfg, ckpt, str(tmp_path / 'missing.png')])
