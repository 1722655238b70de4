"""``tools/dist_train.sh``: two processes match one on the same global batch, and the ranks draw their
own dropout masks and resume exactly.

Every run is a subprocess on a tiny ViT and a 192-image subset of the digits dataset, so these tests
exercise exactly what users run."""
import numpy as np
import pytest

from helpers.common import read_losses
from helpers.training_runs import dist_train, final_weights, read_dropout, tiny_config, train


pytestmark = pytest.mark.slow


def test_ddp_two_processes_match_one_process(tmp_path, digits_root):
    # Same global batch (2 x 16 vs 1 x 32), same samples per step (DefaultSampler hands rank r the
    # r-th of every 2 shuffled indices), deterministic data and no dropout: the mean of the two
    # ranks' losses must equal the single process's loss, and the weights must stay equal.
    single = tiny_config(tmp_path / 'single.py', digits_root, batch_size=32, max_epochs=2,
                         deterministic_data=True, drop_rate=0.0)
    double = tiny_config(tmp_path / 'double.py', digits_root, batch_size=16, max_epochs=2,
                         deterministic_data=True, drop_rate=0.0)
    train(single, tmp_path / 'one')
    dist_train(double, tmp_path / 'two')

    one = read_losses(tmp_path / 'one')
    rank0, rank1 = read_losses(tmp_path / 'two', 0), read_losses(tmp_path / 'two', 1)
    assert sorted(one) == sorted(rank0) == sorted(rank1) == list(range(12))  # 2 epochs x 6 steps
    mean_two = np.array([(rank0[i] + rank1[i]) / 2 for i in sorted(one)])
    single_losses = np.array([one[i] for i in sorted(one)])
    assert not np.allclose(np.array([rank0[i] for i in sorted(one)]), single_losses, atol=1e-3)  # halves differ
    np.testing.assert_allclose(mean_two, single_losses, rtol=0, atol=2e-5)
    assert single_losses[-1] < single_losses[0]

    w1, w2 = final_weights(tmp_path / 'one'), final_weights(tmp_path / 'two')
    assert set(w1) == set(w2)
    for key in w1:
        np.testing.assert_allclose(w2[key].float().numpy(), w1[key].float().numpy(), rtol=0, atol=1e-4,
                                   err_msg=key)


def test_ddp_ranks_draw_their_own_masks_and_resume_exactly(tmp_path, digits_root):
    # Deterministic data, so that nothing but the seeds could make the ranks' random streams differ;
    # dropout on. Each rank must drop other entries than the other rank at every step (one global
    # batch, not two copies of one rank's masks), and a run resumed from the epoch-1 checkpoint
    # must repeat every rank's masks and losses of epoch 2.
    cfg = tiny_config(tmp_path / 'cfg.py', digits_root, batch_size=16, max_epochs=2, deterministic_data=True)
    dist_train(cfg, tmp_path / 'full')
    masks = [read_dropout(tmp_path / 'full', rank) for rank in (0, 1)]
    losses = [read_losses(tmp_path / 'full', rank) for rank in (0, 1)]
    assert sorted(masks[0]) == sorted(masks[1]) == sorted(losses[0]) == list(range(12))
    for step in range(12):
        assert masks[0][step][0] != masks[1][step][0], step
        assert all(0.05 < m[step][1] < 0.15 for m in masks)  # drop_rate 0.1: the masks are real
    assert len({digest for m in masks for digest, _ in m.values()}) == 24  # and new at every step

    dist_train(cfg, tmp_path / 'resumed', '--resume', str(tmp_path / 'full' / 'epoch_1.pth'))
    for rank in (0, 1):
        after = read_losses(tmp_path / 'resumed', rank)
        assert sorted(after) == list(range(6, 12))
        assert read_dropout(tmp_path / 'resumed', rank) == {i: masks[rank][i] for i in range(6, 12)}
        np.testing.assert_allclose([after[i] for i in range(6, 12)], [losses[rank][i] for i in range(6, 12)],
                                   rtol=0, atol=1e-6)
