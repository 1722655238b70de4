"""Reading one tar: the labels of each source and layout, and bad input (damaged, compressed, a sample
without image or label, a label that is no number, a synset outside the label space) named before training."""
import bz2
import gzip
import lzma
import os
import os.path as osp
import re
import shutil
import subprocess
import tarfile
import tempfile

import pytest

from helpers.tar_index_fixtures import open_index, read_image, samples, wds  # noqa: F401 (fixtures)
from helpers.tar_shards import add_member, toy_synsets, write_tar_of_tars, write_wds
from vit_plugin import label_spaces
from vit_plugin.datasets.tar_index import TarShardIndex
from vit_plugin.datasets.tar_scan import LabelRule, TarIndexError
from vit_plugin.datasets.tar_shards import resolve_shards


@pytest.mark.parametrize('rule', [LabelRule('json', 'label'),
                                  LabelRule('synset', synsets=tuple(label_spaces.synsets('fall11'))),
                                  LabelRule('synset')], ids=['json', 'synset-fall11', 'synset-from-data'])
def test_json_and_synset_labels_agree_with_cls(wds, samples, rule):
    index = open_index(wds, rule)
    assert index.labels.tolist() == [s.label for s in samples]  # toy classes are fall11's first synsets
    assert index.synsets == (None if rule.synsets or rule.source != 'synset' else tuple(toy_synsets()))


def test_tar_of_tars_numbers_the_inner_tars_synsets(tmp_path, samples):
    path = str(tmp_path / 'train_whole.tar')
    keys = write_tar_of_tars(path, samples)
    shards = resolve_shards(str(tmp_path), 'train_whole.tar')
    index = TarShardIndex.open(shards, layout='tar_of_tars', rule=LabelRule('synset'), workers=2)
    order = [k for synset in keys for k in keys[synset]]
    assert [index.key(i) for i in range(len(index))] == order
    by_key = {s.key: s for s in samples}
    assert index.labels.tolist() == [sorted(keys).index(by_key[k].synset) for k in order]
    assert all(read_image(index, i) == by_key[k].jpg for i, k in enumerate(order))
    assert index.member(0) == f'{sorted(keys)[0]}.tar/{order[0]}.JPEG'


# --------------------------------------------------------------------------------------- bad input
def _truncate_mid_member(folder):
    path = osp.join(folder, 'imagenet22k-train-0001.tar')
    size = os.path.getsize(path)
    with open(path, 'r+b') as f:
        f.truncate(size // 2)
    return 'imagenet22k-train-0001.tar', 'truncated'


def _truncate_at_member_end(folder):
    path = osp.join(folder, 'imagenet22k-train-0001.tar')
    with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) - 1024 * 10)  # drops the end-of-archive blocks and padding
    return 'imagenet22k-train-0001.tar', 'truncated'


def _gzip_content(folder):
    path = osp.join(folder, 'imagenet22k-train-0002.tar')
    data = open(path, 'rb').read()
    with open(path, 'wb') as f:
        f.write(gzip.compress(data))
    return 'imagenet22k-train-0002.tar', 'decompress it first'


def _missing(folder):
    os.remove(osp.join(folder, 'imagenet22k-train-0002.tar'))
    return 'imagenet22k-train-0002.tar', 'missing or unreadable'


def _a_folder(folder):
    path = osp.join(folder, 'imagenet22k-train-0000.tar')
    os.remove(path)
    os.mkdir(path)
    return 'imagenet22k-train-0000.tar', 'cannot be read'


BAD = {'truncated-mid-member': _truncate_mid_member, 'truncated-between-members': _truncate_at_member_end,
       'gzip': _gzip_content, 'missing': _missing, 'not-a-file': _a_folder}


@pytest.mark.parametrize('damage', sorted(BAD))
def test_a_damaged_shard_is_named_before_training(wds, damage):
    shard, reason = BAD[damage](wds)
    with pytest.raises(TarIndexError) as err:
        open_index(wds, LabelRule('cls'), shards='imagenet22k-train-{0000..0002}.tar')
    assert shard in str(err.value) and reason in str(err.value)
    folder = osp.join(wds, '.vit_plugin_index')  # no index; the good shards' scans are kept for the next build
    assert not osp.exists(folder) or not any(n.endswith('.index') for n in os.listdir(folder))


def suggested_commands(message):
    """The shell commands an error message gives (between backquotes)."""
    return re.findall(r'`([^`]+)`', message)


def run_commands(message, cwd):
    commands = suggested_commands(message)
    assert commands, message
    for command in commands:
        subprocess.run(['bash', '-c', command], cwd=cwd, check=True, capture_output=True)


COMPRESSORS = {'gzip': ('.tar.gz', gzip.compress), 'bzip2': ('.tar.bz2', bz2.compress),
               'xz': ('.tar.xz', lzma.compress), 'zstd': ('.tar.zst', None)}


def compress(tool, data, path):
    if COMPRESSORS[tool][1] is not None:
        open(path, 'wb').write(COMPRESSORS[tool][1](data))
    else:
        subprocess.run([tool, '-q', '-f', '-o', path], input=data, check=True)


@pytest.mark.parametrize('tool', sorted(COMPRESSORS))
def test_a_compressed_shard_names_a_command_that_gives_the_tar(wds, tool):
    """Named as a compressed tar, or a .tar holding compressed bytes: the command in the error runs on the
    error's own file and leaves the .tar that then indexes."""
    if shutil.which(tool) is None:
        pytest.skip(f'{tool} is not installed')
    good = open_index(wds).labels.tolist()
    name = 'imagenet22k-train-0001.tar'
    path = osp.join(wds, name)
    data = open(path, 'rb').read()
    suffix = COMPRESSORS[tool][0]
    packed = path[:-len('.tar')] + suffix
    compress(tool, data, packed)
    os.remove(path)
    with pytest.raises(TarIndexError, match='decompress it first') as err:
        resolve_shards(wds, ['imagenet22k-train-0000.tar', name[:-len('.tar')] + suffix, 'imagenet22k-train-0002.tar'])
    run_commands(str(err.value), tempfile.mkdtemp(dir=wds))
    assert open(path, 'rb').read() == data and open_index(wds).labels.tolist() == good
    compress(tool, data, path)  # compressed bytes under the .tar name
    with pytest.raises(TarIndexError, match=f'{tool}-compressed data under a .tar name') as err:
        open_index(wds)
    run_commands(str(err.value), tempfile.mkdtemp(dir=wds))
    assert open(path, 'rb').read() == data and open_index(wds).labels.tolist() == good


def test_a_folder_of_compressed_tars_names_a_command(tmp_path, samples):
    folder = str(tmp_path / 'packed')
    names = write_wds(folder, samples[:6], (6,), info=False)
    path = osp.join(folder, names[0])
    data = open(path, 'rb').read()
    open(path + '.gz', 'wb').write(gzip.compress(data))
    os.remove(path)
    with pytest.raises(TarIndexError, match='compressed tars.*decompress them first') as err:
        resolve_shards(folder, None, None)
    run_commands(str(err.value), str(tmp_path))
    assert open(path, 'rb').read() == data and len(open_index(folder, split=None)) == 6


@pytest.mark.parametrize('members, rule, expect', [
    (('cls', 'json'), LabelRule('cls'), 'no image member'),
    (('jpg', 'json'), LabelRule('cls'), "no 'cls' member"),
    (('jpg', 'cls'), LabelRule('json'), "no 'json' member"),
])
def test_a_sample_without_image_or_label_stops_the_build(tmp_path, samples, members, rule, expect):
    folder = str(tmp_path / 'bad')
    write_wds(folder, samples[:4], (4,), members=members, info=False)
    with pytest.raises(TarIndexError, match=expect) as err:
        open_index(folder, rule)
    assert 'imagenet22k-train-0000.tar' in str(err.value) and samples[0].key in str(err.value)


def test_a_label_that_is_not_a_number_is_named(tmp_path, samples):
    folder = tmp_path / 'text'
    folder.mkdir()
    with tarfile.open(folder / 'imagenet22k-train-0000.tar', 'w') as tf:
        add_member(tf, samples[0].key + '.jpg', samples[0].jpg)
        add_member(tf, samples[0].key + '.cls', b'tench')
    with pytest.raises(TarIndexError, match=f"sample '{samples[0].key}': the cls 'tench' is not an integer label"):
        open_index(str(folder))


def test_a_synset_outside_the_label_space_is_named(wds, samples):
    with pytest.raises(TarIndexError) as err:
        open_index(wds, LabelRule('synset', synsets=tuple(label_spaces.synsets('fall11')[3:])))
    first = next(s for s in samples if s.label < 3)
    assert first.synset in str(err.value) and 'not in the label space' in str(err.value)
