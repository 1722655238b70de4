"""``tools/dist_train.sh``: two processes match one on the same global batch, and the ranks draw their
own dropout masks and resume exactly.

Every multi-process run is ``tools/dist_train.sh`` on a tiny ViT and a 192-image subset of the digits
dataset, so these tests exercise exactly what users run; the single-process reference is ``tools/train.py``'s
``main`` in the test process, with one thread like each rank. Each scenario's runs are module-scoped
fixtures, each run once; each test checks one claim."""
import numpy as np
import pytest

from helpers.common import read_losses
from helpers.in_process import train_in_process
from helpers.subprocess_like import like_a_subprocess
from helpers.training_runs import dist_train, final_weights, read_dropout, tiny_config

pytestmark = pytest.mark.slow


# Same global batch (2 x 16 vs 1 x 32), same samples per step (DefaultSampler hands rank r the r-th of
# every 2 shuffled indices), deterministic data and no dropout: the mean of the two ranks' losses must
# equal the single process's loss, and the weights must stay equal.
@pytest.fixture(scope='module')
def one_and_two(tmp_path_factory, digits_root):
    """The work dirs of a single-process run and of the same run on two processes."""
    root = tmp_path_factory.mktemp('one_and_two')
    single = tiny_config(root / 'single.py', digits_root, batch_size=32, max_epochs=2, deterministic_data=True,
                         drop_rate=0.0)
    double = tiny_config(root / 'double.py', digits_root, batch_size=16, max_epochs=2, deterministic_data=True,
                         drop_rate=0.0)
    with like_a_subprocess('loss_recorder', 'dropout_recorder'):
        outcome = train_in_process(single, root / 'one')
    assert outcome.code == 0, outcome.output[-4000:]
    dist_train(double, root / 'two')
    return root / 'one', root / 'two'


@pytest.fixture(scope='module')
def one_and_two_losses(one_and_two):
    """(the single process's losses, rank 0's, rank 1's), each iteration -> loss."""
    one, two = one_and_two
    return read_losses(one), read_losses(two, 0), read_losses(two, 1)


def test_ddp_and_single_runs_record_every_iteration(one_and_two_losses):
    one, rank0, rank1 = one_and_two_losses
    assert sorted(one) == sorted(rank0) == sorted(rank1) == list(range(12))  # 2 epochs x 6 steps


def test_ddp_ranks_train_on_different_halves(one_and_two_losses):
    one, rank0, _ = one_and_two_losses
    single_losses = np.array([one[i] for i in sorted(one)])
    assert not np.allclose(np.array([rank0[i] for i in sorted(one)]), single_losses, atol=1e-3)  # halves differ


def test_ddp_two_processes_match_one_process(one_and_two_losses):
    one, rank0, rank1 = one_and_two_losses
    mean_two = np.array([(rank0[i] + rank1[i]) / 2 for i in sorted(one)])
    single_losses = np.array([one[i] for i in sorted(one)])
    np.testing.assert_allclose(mean_two, single_losses, rtol=0, atol=2e-5)


def test_ddp_reference_run_lowers_the_loss(one_and_two_losses):
    one, _, _ = one_and_two_losses
    single_losses = np.array([one[i] for i in sorted(one)])
    assert single_losses[-1] < single_losses[0]


def test_ddp_two_processes_end_with_the_weights_of_one(one_and_two):
    w1, w2 = (final_weights(work) for work in one_and_two)
    assert set(w1) == set(w2)
    for key in w1:
        np.testing.assert_allclose(w2[key].float().numpy(), w1[key].float().numpy(), rtol=0, atol=1e-4,
                                   err_msg=key)


# Deterministic data, so that nothing but the seeds could make the ranks' random streams differ; dropout
# on. Each rank must drop other entries than the other rank at every step (one global batch, not two
# copies of one rank's masks), and a run resumed from the epoch-1 checkpoint must repeat every rank's
# masks and losses of epoch 2.
@pytest.fixture(scope='module')
def masks_run(tmp_path_factory, digits_root):
    """A 2-process run with dropout: its config, work dir, and each rank's masks and losses."""
    root = tmp_path_factory.mktemp('masks')
    cfg = tiny_config(root / 'cfg.py', digits_root, batch_size=16, max_epochs=2, deterministic_data=True)
    dist_train(cfg, root / 'full')
    return dict(cfg=cfg, root=root, masks=[read_dropout(root / 'full', rank) for rank in (0, 1)],
                losses=[read_losses(root / 'full', rank) for rank in (0, 1)])


@pytest.fixture(scope='module')
def masks_resumed(masks_run):
    """The same run resumed from its epoch-1 checkpoint, in a new work dir."""
    root = masks_run['root']
    dist_train(masks_run['cfg'], root / 'resumed', '--resume', str(root / 'full' / 'epoch_1.pth'))
    return root / 'resumed'


def test_ddp_ranks_draw_their_own_masks(masks_run):
    masks, losses = masks_run['masks'], masks_run['losses']
    assert sorted(masks[0]) == sorted(masks[1]) == sorted(losses[0]) == list(range(12))
    for step in range(12):
        assert masks[0][step][0] != masks[1][step][0], step
        assert all(0.05 < m[step][1] < 0.15 for m in masks)  # drop_rate 0.1: the masks are real
    assert len({digest for m in masks for digest, _ in m.values()}) == 24  # and new at every step


def test_ddp_resume_repeats_every_ranks_masks_and_losses(masks_run, masks_resumed):
    masks, losses = masks_run['masks'], masks_run['losses']
    for rank in (0, 1):
        after = read_losses(masks_resumed, rank)
        assert sorted(after) == list(range(6, 12))
        assert read_dropout(masks_resumed, rank) == {i: masks[rank][i] for i in range(6, 12)}
        np.testing.assert_allclose([after[i] for i in range(6, 12)], [losses[rank][i] for i in range(6, 12)],
                                   rtol=0, atol=1e-6)
