"""Few-shot linear evaluation: the closed-form solver, the k-shot sampler, the metric, the hook, the tool."""
import glob
import json
import os.path as osp

import numpy as np
import pytest
import scipy.linalg
import torch
import torch.nn as nn
from mmengine.model import BaseModel, ImgDataPreprocessor
from mmengine.structures import BaseDataElement
from torch.utils.data import Dataset

import vit_plugin  # noqa: F401  (registers the vit_plugin scope)
from helpers.common import REPO
from vit_plugin.evaluation import (FewShotLinearMetric, RidgeSolver, fewshot_linear_eval, run_fewshot_eval,
                                   sample_k_shot, select_l2, signed_one_hot)


def _reference_ridge(x, y, l2, standardize):
    """Ridge with an unpenalised bias via scipy's least squares on the augmented system [X; sqrt(l2) I]."""
    mean = x.mean(0)
    scale = x.std(0) + 1e-6 if standardize else np.ones(x.shape[1])
    xs = (x - mean) / scale
    a = np.vstack([xs, np.sqrt(l2) * np.eye(x.shape[1])])
    b = np.vstack([y - y.mean(0), np.zeros((x.shape[1], y.shape[1]))])
    w = scipy.linalg.lstsq(a, b)[0] / scale[:, None]
    return w, y.mean(0) - mean @ w


@pytest.mark.parametrize('n,d', [(12, 40), (60, 8)])  # fewer samples than features (few-shot), and more
@pytest.mark.parametrize('standardize', [False, True])
def test_ridge_solver_equals_scipy_lstsq(n, d, standardize):
    rng = np.random.default_rng(n + d)
    x = rng.normal(size=(n, d)) * rng.uniform(0.1, 10, size=d) + 3.0
    y = signed_one_hot(rng.integers(0, 5, size=n), 5).numpy()
    solver = RidgeSolver(x, y, standardize=standardize)
    for l2 in (1e-3, 0.5, 64.0):
        w, b = solver.coef(l2)
        w_ref, b_ref = _reference_ridge(x, y, l2, standardize)
        np.testing.assert_allclose(w.numpy(), w_ref, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(b.numpy(), b_ref, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(solver.predict(x, l2).numpy(), x @ w_ref + b_ref, rtol=1e-7, atol=1e-9)


def test_ridge_solver_without_regulariser_is_min_norm_least_squares():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 20)), rng.normal(size=(6, 3))
    w, b = RidgeSolver(x, y, standardize=False).coef(0.0)
    w_ref = np.linalg.pinv(x - x.mean(0)) @ (y - y.mean(0))
    np.testing.assert_allclose(w.numpy(), w_ref, atol=1e-10)
    np.testing.assert_allclose((x @ w.numpy() + b.numpy()), y, atol=1e-9)  # interpolates: N < D


def test_ridge_solver_rejects_bad_input():
    with pytest.raises(ValueError, match='NaN or Inf'):
        RidgeSolver(np.array([[np.nan, 1.0], [0.0, 1.0]]), np.ones((2, 2)))
    with pytest.raises(ValueError, match='same N'):
        RidgeSolver(np.ones((3, 2)), np.ones((2, 2)))


def test_signed_one_hot_targets():
    t = signed_one_hot([2, 0], 3)
    assert t.tolist() == [[-1, -1, 1], [1, -1, -1]]
    with pytest.raises(ValueError, match='out of range'):
        signed_one_hot([3], 3)


def _separable(num_classes=10, per_class=40, dims=64, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(num_classes, dims)) * 4
    labels = np.repeat(np.arange(num_classes), per_class)
    return centres[labels] + rng.normal(size=(len(labels), dims)) * 0.5, labels


def test_linearly_separable_features_reach_100_percent():
    support, support_labels = _separable(seed=0)
    query, query_labels = _separable(per_class=20, seed=0)
    query = query + np.random.default_rng(1).normal(size=query.shape) * 0.1
    results = fewshot_linear_eval(support, support_labels, query, query_labels, shots=(1, 5, 10, 25))
    assert {k: r['top1'] for k, r in results.items()} == {1: 100.0, 5: 100.0, 10: 100.0, 25: 100.0}
    assert [r['num_support'] for r in results.values()] == [10, 50, 100, 250]


def test_k_shot_sampler_is_seeded_class_balanced_nested_and_disjoint_from_holdout():
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(7), 30))
    subsets, holdout = sample_k_shot(labels, (1, 5, 10, 25), seed=3, num_holdout_per_class=2)
    for k, idx in subsets.items():
        assert np.bincount(labels[idx], minlength=7).tolist() == [k] * 7
        assert len(set(idx.tolist())) == len(idx)
    assert np.bincount(labels[holdout], minlength=7).tolist() == [2] * 7
    assert set(subsets[1]) <= set(subsets[5]) <= set(subsets[10]) <= set(subsets[25])
    assert not set(subsets[25]) & set(holdout)
    again, holdout_again = sample_k_shot(labels, (1, 5, 10, 25), seed=3, num_holdout_per_class=2)
    assert all(np.array_equal(subsets[k], again[k]) for k in subsets) and np.array_equal(holdout, holdout_again)
    other, _ = sample_k_shot(labels, (1, 5, 10, 25), seed=4, num_holdout_per_class=2)
    assert not np.array_equal(subsets[5], other[5])


def test_k_shot_sampler_names_the_short_class():
    labels = np.array([0] * 10 + [1] * 3)
    with pytest.raises(ValueError, match=r'needs 6 samples of every class.*class 1: 3'):
        sample_k_shot(labels, (5, ), num_holdout_per_class=1)
    with pytest.raises(ValueError, match='class 2: 0'):
        sample_k_shot(labels, (1, ), num_classes=3)


def test_regulariser_is_chosen_on_the_holdout_split():
    x, labels = _separable(num_classes=4, per_class=12, dims=30, seed=5)
    x = x + np.random.default_rng(2).normal(size=x.shape) * 6  # noisy: the regulariser matters
    grid = (2.0**-8, 1.0, 2.0**8, 2.0**16)
    solver = RidgeSolver(x[:20], signed_one_hot(labels[:20], 4))
    l2, acc = select_l2(solver, x[20:], labels[20:], grid)
    accs = {g: solver.accuracy(x[20:], labels[20:], g) for g in grid}
    assert acc == max(accs.values()) and accs[l2] == acc
    assert l2 == max(g for g in grid if accs[g] == acc)  # ties go to the strongest regulariser
    with pytest.raises(ValueError, match='held-out split'):
        fewshot_linear_eval(x, labels, x, labels, shots=(1, ), num_holdout_per_class=0, l2_grid=grid)


def _records(feats, labels, split):
    return [dict(feat=torch.as_tensor(f), gt_label=int(c), split=split, sample_idx=i)
            for i, (f, c) in enumerate(zip(feats, labels))]


def test_metric_matches_the_function_and_drops_distributed_padding():
    support, support_labels = _separable(num_classes=5, per_class=30, dims=16, seed=1)
    query, query_labels = _separable(num_classes=5, per_class=10, dims=16, seed=1)
    query = query + np.random.default_rng(0).normal(size=query.shape) * 3
    metric = FewShotLinearMetric(shots=(1, 5), seed=2)
    records = _records(support, support_labels, 'support') + _records(query, query_labels, 'query')
    metric.process(None, records + records[:7])  # padding repeats samples
    metrics = metric.evaluate(len(records) + 7)
    expected = fewshot_linear_eval(support.astype(np.float32), support_labels, query.astype(np.float32),
                                   query_labels, shots=(1, 5), seed=2)
    assert metrics['fewshot/1shot_top1'] == pytest.approx(expected[1]['top1'])
    assert metrics['fewshot/5shot_top1'] == pytest.approx(expected[5]['top1'])
    assert metrics['fewshot/5shot_log2_l2'] == pytest.approx(np.log2(expected[5]['l2']))
    with pytest.raises(ValueError, match='feature records'):
        metric.process(None, [dict(pred_label=1)])


# ---------------------------------------------------------------- runner integration (hook + loop)
class _Blobs(Dataset):
    """Tiny image dataset: class c is an 8x8 image whose brightness pattern encodes c."""

    def __init__(self, per_class=12, num_classes=3, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for c in range(num_classes):
            for _ in range(per_class):
                img = torch.rand(3, 8, 8, generator=g) * 40
                img[c] += 200
                self.items.append((img, c))
        self.metainfo = dict(classes=tuple(str(c) for c in range(num_classes)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        img, c = self.items[i]
        return dict(inputs=img, data_samples=BaseDataElement(gt_label=torch.tensor([c]), metainfo=dict(sample_idx=i)))


class _TinyNet(BaseModel):

    def __init__(self):
        super().__init__(data_preprocessor=ImgDataPreprocessor(mean=[128] * 3, std=[64] * 3))
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(8, 3)

    def extract_feat(self, inputs):
        return self.body(inputs)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        logits = self.fc(self.extract_feat(inputs))
        if mode == 'loss':
            labels = torch.cat([s.gt_label for s in data_samples])
            return dict(loss=nn.functional.cross_entropy(logits, labels))
        return logits


def _loader(**kw):
    return dict(dataset=_Blobs(**kw), batch_size=8, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=False),
                collate_fn=dict(type='pseudo_collate'))


def test_hook_and_val_loop_evaluate_during_training(tmp_path):
    from mmengine.runner import Runner

    hook = dict(type='vit_plugin.FewShotEvalHook', interval=2, support_dataloader=_loader(seed=1),
                query_dataloader=_loader(per_class=5, seed=2),
                metric=dict(type='vit_plugin.FewShotLinearMetric', shots=(1, 5), num_holdout_per_class=1))
    runner = Runner(model=_TinyNet(), work_dir=str(tmp_path), train_dataloader=_loader(seed=0),
                    optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
                    train_cfg=dict(by_epoch=False, max_iters=3, val_interval=3),
                    val_dataloader=_loader(per_class=5, seed=2),
                    val_evaluator=dict(type='vit_plugin.FewShotLinearMetric', shots=(1, 5), num_holdout_per_class=1),
                    val_cfg=dict(type='vit_plugin.FewShotValLoop', support_dataloader=_loader(seed=1)),
                    custom_hooks=[hook], default_hooks=dict(logger=dict(type='LoggerHook', interval=1)),
                    default_scope='mmengine')
    runner.train()
    fewshot_hook = next(h for h in runner.hooks if type(h).__name__ == 'FewShotEvalHook')
    # Iterations 2 and 3 (the last): the brightness code is linearly readable from the features.
    assert fewshot_hook.last_metrics['fewshot/5shot_top1'] == 100.0
    assert runner.model.training  # training mode restored after each evaluation
    scalars = [json.loads(line) for line in open(osp.join(runner.log_dir, 'vis_data', 'scalars.json'))]
    hook_steps = [s['step'] for s in scalars if 'fewshot/1shot_top1' in s and 'lr' not in s]
    assert 2 in hook_steps and 3 in hook_steps
    val = runner.val_loop.run()  # the loop on its own, as `val_cfg`
    assert val['fewshot/5shot_top1'] == 100.0 and set(val) >= {'fewshot/1shot_top1', 'fewshot/1shot_log2_l2'}


def test_run_fewshot_eval_needs_labels():
    class NoLabels(_Blobs):

        def __getitem__(self, i):
            return dict(inputs=self.items[i][0], data_samples=BaseDataElement(metainfo=dict(sample_idx=i)))

    from mmengine.runner import Runner
    loader = Runner.build_dataloader(dict(_loader(), dataset=NoLabels()))
    with pytest.raises(ValueError, match='gt_label'):
        run_fewshot_eval(_TinyNet(), loader, loader, FewShotLinearMetric(shots=(1, )))


# ---------------------------------------------------------------- tools/fewshot_eval.py on a real config
@pytest.fixture(scope='module')
def demo_setup(tmp_path_factory):
    """The demo config shrunk (tiny ViT, digits data in a temp dir) and a checkpoint of it."""
    from vit_plugin.evaluation.model_loading import load_config
    from mmengine.registry import MODELS

    tmp = tmp_path_factory.mktemp('fewshot_tool')
    options = {'model.backbone.arch.embed_dims': 32, 'model.backbone.arch.num_layers': 2,
               'model.backbone.arch.num_heads': 2, 'model.backbone.arch.mlp_dims': 64, 'model.head.in_channels': 32,
               'train_dataloader.dataset.data_root': str(tmp / 'digits'),
               'test_dataloader.dataset.data_root': str(tmp / 'digits')}
    cfg = load_config(osp.join(REPO, 'configs', 'vit_demo_digits.py'), options)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    ckpt = tmp / 'tiny.pth'
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), ckpt)
    return tmp, options, str(ckpt), model.eval()


def _options_argv(options):
    return ['--cfg-options'] + [f'{k}={v}' for k, v in options.items()]


def _pre_logits_of_split(model, root, split):
    """The model's pre-logits features of every image of a digits split, computed here without the
    tool or the dataset classes: the PNGs in the folder-per-class order (classes, then file names),
    pixels to [-1, 1] as the config's preprocessor does, one batch of 64 at a time as the tool runs."""
    from PIL import Image
    paths = sorted(glob.glob(osp.join(root, split, '*', '*.png')))
    labels = np.array([int(osp.basename(osp.dirname(p))) for p in paths])
    gray = np.stack([np.asarray(Image.open(p), dtype=np.float32) for p in paths])
    images = torch.from_numpy((gray - 127.5) / 127.5)[:, None].expand(-1, 3, -1, -1)
    with torch.no_grad():
        feats = torch.cat([model.extract_feat(images[i:i + 64], stage='pre_logits')
                           for i in range(0, len(images), 64)])
    return feats.numpy(), labels


def test_fewshot_tool_reports_every_shot_and_writes_json(demo_setup, capsys):
    from vit_plugin.cli import fewshot_eval as tool
    tmp, options, ckpt, model = demo_setup
    out = tmp / 'fewshot.json'
    argv = [osp.join(REPO, 'configs', 'vit_demo_digits.py'), ckpt, '--shots', '1', '5', '--num-workers', '0',
            '--out', str(out)] + _options_argv(options)
    metrics = tool.main(argv)
    # The shots come from the train split read without augmentation, the accuracy from the test split,
    # the regulariser from 2 held-out images per class, the k-shot draw from seed 0.
    support, support_labels = _pre_logits_of_split(model, str(tmp / 'digits'), 'train')
    query, query_labels = _pre_logits_of_split(model, str(tmp / 'digits'), 'test')
    assert (len(support), len(query)) == (1438, 359)
    expected = fewshot_linear_eval(support, support_labels, query, query_labels, shots=(1, 5), seed=0,
                                   num_holdout_per_class=2)
    for k in (1, 5):
        assert metrics[f'fewshot/{k}shot_top1'] == pytest.approx(expected[k]['top1'], abs=1e-9)
        assert metrics[f'fewshot/{k}shot_log2_l2'] == pytest.approx(np.log2(expected[k]['l2']))
    saved = json.load(open(out))
    assert saved['seed'] == 0 and saved['checkpoint'] == ckpt
    assert saved['metrics']['fewshot/5shot_top1'] == pytest.approx(expected[5]['top1'], abs=1e-9)
    assert f"| 5 | {expected[5]['top1']:.2f} |" in capsys.readouterr().out


def test_fewshot_tool_refuses_a_checkpoint_of_another_model(demo_setup, tmp_path, capsys):
    from vit_plugin.cli.common import run
    from vit_plugin.models.backbones.vit import ViT
    from vit_plugin.cli import fewshot_eval as tool
    _, options, _, _ = demo_setup
    other = ViT(arch=dict(embed_dims=48, num_layers=2, num_heads=2, mlp_dims=64), img_size=32, patch_size=4)
    bad = tmp_path / 'other.pth'
    torch.save(dict(state_dict={f'backbone.{k}': v for k, v in other.state_dict().items()}), bad)
    argv = [osp.join(REPO, 'configs', 'vit_demo_digits.py'), str(bad), '--num-workers', '0'] + _options_argv(options)
    assert run(tool.main, argv) == 2
    err = capsys.readouterr().err
    assert 'does not fit the ViT' in err and 'backbone.patch_embed.proj.weight' in err
