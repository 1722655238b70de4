"""A converted checkpoint's classifier put in another label space (as a pure function and through
tools/convert_checkpoint.py --head-label-space), against timm's shipped Google -> fall11 row map."""
import os.path as osp
import pkgutil

import pytest
import torch

from helpers.official_npz import official_arrays, save_npz
from vit_plugin.converters import ConversionError, convert_jax_vit
from vit_plugin.converters.head_label_space import convert_head_label_space

HEAD = 'head.layers.head.'


@pytest.fixture(scope='module')
def official(tmp_path_factory):
    """A tiny official in21k checkpoint (21,843 classes, pre-logits layer), converted, and timm's map."""
    arrays = official_arrays(dim=8, heads=2, mlp=16, depth=1, patch=8, grid=(2, 2), classes=21843, pre_logits=8)
    text = pkgutil.get_data('timm.data', '_info/imagenet21k_goog_to_22k_indices.txt').decode()
    return dict(path=save_npz(tmp_path_factory.mktemp('in21k') / 'in21k.npz', arrays),
                state=convert_jax_vit(arrays)[0], goog_rows=torch.tensor([int(v) for v in text.split()]))


def test_the_classifier_takes_timms_row_order(official):
    state, rows = official['state'], official['goog_rows']
    new, report, _ = convert_head_label_space(state, 'google21k', 'fall11')
    assert torch.equal(new[HEAD + 'weight'], state[HEAD + 'weight'][rows])
    assert torch.equal(new[HEAD + 'bias'], state[HEAD + 'bias'][rows])


def test_everything_but_the_classifier_is_kept(official):
    new, _, _ = convert_head_label_space(official['state'], 'in21k', 'in22k')
    assert all(new[k] is v for k, v in official['state'].items() if not k.startswith(HEAD))


def test_class_names_follow_the_rows(official):
    classes = [f'class {i}' for i in range(21843)]
    _, _, fall11 = convert_head_label_space(official['state'], 'google21k', 'fall11', classes=classes)
    _, _, back = convert_head_label_space(convert_head_label_space(official['state'], 'google21k', 'fall11')[0],
                                          'fall11', 'google21k', classes=fall11)
    assert back[:9205] == classes[:9205] and back[9205] == 'n03931044' and back[9206:15027] == classes[9206:15027]


def test_a_classifier_of_another_size_is_refused(official):
    with pytest.raises(ConversionError, match=r'has 21843 rows but label space fall11 has 21841 classes'):
        convert_head_label_space(official['state'], 'fall11', 'google21k')


def test_tool_writes_the_fall11_head(official, tmp_path, capsys):
    from vit_plugin.cli.convert_checkpoint import main  # the tool's module: the command line
    dst = str(tmp_path / 'fall11.pth')
    assert main([official['path'], dst, '--head-label-space', 'google21k:fall11']) == 0
    assert 'label space google21k (21,843 rows) -> fall11 (21,841): 21,841 classes carried over, 2 of google21k ' \
           'dropped (n03931044, n09859684: not in fall11)' in capsys.readouterr().out
    head = torch.load(dst, weights_only=True)['state_dict'][HEAD + 'weight']
    assert torch.equal(head, official['state'][HEAD + 'weight'][official['goog_rows']])


@pytest.mark.parametrize('extra, message', [
    (['--head-label-space', 'google21k-fall11'], 'takes SRC:DST (e.g. google21k:fall11)'),
    (['--head-label-space', 'google21k:in30k'], "unknown label space 'in30k'"),
    (['--head-label-space', 'google21k:fall11', '--num-classes', '5'], 'which --num-classes and --backbone-only drop'),
])
def test_tool_refuses_a_bad_request_and_writes_nothing(official, tmp_path, capsys, extra, message):
    from vit_plugin.cli.convert_checkpoint import main  # the tool's module: the command line
    dst = str(tmp_path / 'out.pth')
    assert main([official['path'], dst] + extra) == 1
    assert message in capsys.readouterr().err and not osp.exists(dst)
