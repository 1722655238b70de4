"""The array-backed list-file index behind ``vit_plugin.ImageNet21k``."""
import os
import os.path as osp
import pickle
import re

import numpy as np
import pytest
from mmengine.config import Config
from mmengine.registry import DATASETS, DefaultScope
from mmpretrain.datasets import CustomDataset as MMPretrainCustomDataset
from mmpretrain.datasets import ImageNet21k as MMPretrainImageNet21k
from torch.utils.data import DataLoader

from helpers.collate import collate_infos
from helpers.common import REPO
from vit_plugin.datasets import array_file, compact_index
from vit_plugin.datasets.checked import ImageNet, ImageNet21k, NoSamplesError
from vit_plugin.datasets.compact_index import ListFileError, ListFileIndex, parse_list_file


# Lines mmpretrain accepts, with its corner cases: spaces inside a path (the label follows the *last*
# space, so a double space leaves one in the path), surrounding whitespace, CRLF, a tab kept inside
# the path, non-ASCII names, an absolute path, large labels and a last line without a newline.
TRICKY = ('n01440764/n01440764_10026.JPEG 0\n'
          'n01443537/with space.JPEG 1\n'
          '  n01484850/leading.JPEG 2\n'
          'n01491361/crlf.JPEG 3\r\n'
          'n01494475/double.JPEG  4\n'
          'n01496331/tab\tinside.JPEG 21840\n'
          'n01498041/trailing.JPEG 5 \t\n'
          'n01514668/Zürich café.JPEG 6\n'
          '/abs/n01514859/x.JPEG 123456789\n'
          'n01518878/last.JPEG 7')


def records(dataset):
    return [(info['img_path'], info['gt_label'], info['sample_idx'])
            for info in (dataset.get_data_info(i) for i in range(len(dataset)))]


def make_root(tmp_path, text, name='train.txt'):
    (tmp_path / 'meta').mkdir(exist_ok=True)
    (tmp_path / 'train').mkdir(exist_ok=True)
    (tmp_path / 'meta' / name).write_bytes(text.encode('utf-8'))
    return str(tmp_path)


def build(root, cls=ImageNet21k, **kwargs):
    return cls(data_root=root, ann_file='meta/train.txt', data_prefix='train', pipeline=[], **kwargs)


def test_records_equal_mmpretrains(tmp_path):
    root = make_root(tmp_path, TRICKY)
    ours = build(root)
    expected = records(build(root, MMPretrainImageNet21k))
    assert len(expected) == 10 and expected[4][0].endswith('double.JPEG ') and expected[8][1] == 123456789
    assert records(ours) == expected
    assert records(build(root, MMPretrainCustomDataset)) == expected
    np.testing.assert_array_equal(ours.get_gt_labels(), build(root, MMPretrainImageNet21k).get_gt_labels())
    assert ours.get_cat_ids(5) == [21840]
    assert ours.get_data_info(-1) == build(root, MMPretrainImageNet21k).get_data_info(-1)
    assert ours._index.paths.dtype == np.uint8 and ours._index.labels.dtype == np.int32
    with pytest.raises(IndexError):
        ours.get_data_info(10)


@pytest.mark.parametrize('indices', [3, -4, [9, 0, 4, -1]])
def test_indices_and_subsets_keep_mmengine_semantics(tmp_path, indices):
    root = make_root(tmp_path, TRICKY)
    reference = build(root, MMPretrainImageNet21k, serialize_data=False)
    assert records(build(root, indices=indices)) == records(build(root, MMPretrainImageNet21k, indices=indices))
    ours = build(root)
    sub = ours.get_subset(indices)
    assert records(sub) == records(reference.get_subset(indices)) and len(ours) == 10
    ours.get_subset_(indices)
    assert records(ours) == records(sub)
    np.testing.assert_array_equal(ours.get_gt_labels(), [r[1] for r in records(sub)])


def test_lazy_init_metainfo_and_test_mode(tmp_path):
    root = make_root(tmp_path, TRICKY)
    ds = build(root, lazy_init=True, test_mode=True, classes=[f'c{i}' for i in range(21841)])
    assert not ds._fully_initialized and ds._index is None
    assert len(ds) == 10 and ds._fully_initialized  # mmengine's force_full_init
    assert ds.metainfo['classes'][21840] == 'c21840' and ds.CLASSES[3] == 'c3' and ds.test_mode
    assert ds[1] == {'img_path': osp.join(root, 'train', 'n01443537/with space.JPEG'), 'gt_label': 1,
                     'sample_idx': 1}
    with pytest.raises(ValueError, match='with_label=False'):
        build(root, with_label=False)


def test_parser_chunks_and_arrays(tmp_path):
    path = tmp_path / 'list.txt'
    path.write_bytes(TRICKY.encode() + b'\nn0/' + b'x' * 300 + b'.JPEG 8\n')
    paths, offsets, labels = parse_list_file(str(path))
    assert offsets.dtype == np.int64 and len(offsets) == 12 and offsets[0] == 0
    assert labels.tolist() == [0, 1, 2, 3, 4, 21840, 5, 6, 123456789, 7, 8]
    assert paths[offsets[7]:offsets[8]].tobytes().decode() == 'n01514668/Zürich café.JPEG'
    for chunk in (1, 7, 40):  # lines cut across chunks, and a line longer than a chunk
        again = parse_list_file(str(path), chunk_bytes=chunk)
        for a, b in zip(again, (paths, offsets, labels)):
            np.testing.assert_array_equal(a, b)
    empty = tmp_path / 'empty.txt'
    empty.write_bytes(b'')
    with pytest.raises(ListFileError, match=re.escape(str(empty)) + ': the list file is empty'):
        parse_list_file(str(empty))


@pytest.mark.parametrize('cls', [ImageNet21k, ImageNet])
def test_empty_list_or_no_selected_sample_stops_at_build(tmp_path, cls):
    root = make_root(tmp_path, '')
    ann = osp.join(root, 'meta', 'train.txt')
    with pytest.raises(ValueError, match=re.escape(ann) + r'(: the list file is empty| gives no samples)'):
        build(root, cls)
    (tmp_path / 'meta' / 'train.txt').write_text('a/b.JPEG 0\nc/d.JPEG 1\n')
    with pytest.raises(NoSamplesError, match=re.escape(ann) + r' gives no samples \(after indices=0\)'):
        build(root, cls, indices=0)
    ds = build(root, cls, lazy_init=True)  # lazily: at the first use, still before any batch
    assert len(ds) == 2


def test_label_outside_num_classes_names_file_line_and_value(tmp_path):
    lines = ''.join(f'n{i % 5:02d}/{i}.JPEG {i % 5}\n' for i in range(1000))
    lines = lines.replace('n03/703.JPEG 3\n', 'n03/703.JPEG 7\n').replace('n01/861.JPEG 1\n', 'n01/861.JPEG 5\n')
    root = make_root(tmp_path, lines)
    ann = osp.join(root, 'meta', 'train.txt')
    with pytest.raises(ListFileError) as err:
        build(root, num_classes=5)
    message = str(err.value)
    assert message.startswith(f'{ann}, line 704: label 7 is outside [0, 5)') and 'Set num_classes' in message
    assert '2 of 1,000 labels are outside, the largest label is 7' in message and 'num_classes' in message
    assert len(build(root, num_classes=8)) == 1000  # and the cache it wrote is checked again, per run:
    assert osp.isfile(ann + '.index')
    with pytest.raises(ListFileError, match=r'line 704: label 7 is outside \[0, 6\)'):
        build(root, num_classes=6)
    with pytest.raises(ValueError, match='num_classes must be a positive int'):
        build(root, num_classes=0)


def test_label_check_in_other_layouts_names_the_sample(tmp_path):
    from PIL import Image
    for cls_name in ('n01', 'n02', 'n03'):
        os.makedirs(tmp_path / 'train' / cls_name)
        Image.new('RGB', (8, 8)).save(tmp_path / 'train' / cls_name / '0.JPEG')
    folder = ImageNet21k(data_root=str(tmp_path), data_prefix='train', pipeline=[], num_classes=3)
    assert [r[1] for r in records(folder)] == [0, 1, 2]
    with pytest.raises(ListFileError, match=r'sample 2 \(.*n03/0\.JPEG\) of .*train: label 2 is outside \[0, 2\)'):
        ImageNet21k(data_root=str(tmp_path), data_prefix='train', pipeline=[], num_classes=2)


def test_num_classes_reaches_the_dataset_from_one_config_value():
    # The dataset base defines num_classes once; the dataset, the data preprocessor and (in the model
    # configs) the head take it from there.
    for config in ('vit_b16_in21k.py', 'vit_l16_in21k.py', 'vit_b16_in21k_ft_in1k_384.py',
                   'vit_b16_in21k_ft_pets_384.py', 'vit_demo_digits.py'):
        cfg = Config.fromfile(osp.join(REPO, 'configs', config))
        values = {cfg.num_classes, cfg.data_preprocessor.num_classes, cfg.model.head.num_classes,
                  cfg.train_dataloader.dataset.num_classes}
        assert len(values) == 1, (config, values)


@pytest.mark.parametrize('line,reason,mmpretrain_fails', [
    ('n01/no_label.JPEG', 'no space', True),
    ('n01/x.JPEG seven', 'not a non-negative integer', True),
    ('   ', 'empty line', True),
    # mmpretrain takes these, but no class index is negative or needs ten digits
    ('n01/x.JPEG -1', 'not a non-negative integer', False),
    ('n01/x.JPEG 1234567890', 'more than 9 digits', False),
])
def test_malformed_line_names_file_and_line(tmp_path, line, reason, mmpretrain_fails):
    root = make_root(tmp_path, f'a/b.JPEG 0\nc/d.JPEG 1\n{line}\ne/f.JPEG 2\n')
    with pytest.raises(ListFileError) as err:
        build(root)
    message = str(err.value)
    assert osp.join(root, 'meta/train.txt') in message and 'line 3:' in message and reason in message
    assert repr(line) in message
    if mmpretrain_fails:  # as mmpretrain does, but without saying where
        with pytest.raises(ValueError):
            build(root, MMPretrainImageNet21k)


def test_the_first_bad_line_is_reported_in_any_chunk(tmp_path):
    path = tmp_path / 'list.txt'
    path.write_text('a/b.JPEG 0\nc/d.JPEG 1\ne/f.JPEG 2\ng/h.JPEG 1x\n\nno_label\n')
    for chunk in (8, 1 << 20):  # line numbers count across chunks
        with pytest.raises(ListFileError, match=r'line 4: the label is not a non-negative integer'):
            parse_list_file(str(path), chunk_bytes=chunk)


def test_invalid_utf8_names_the_line(tmp_path):
    root = make_root(tmp_path, '')
    (tmp_path / 'meta' / 'train.txt').write_bytes(b'a/b.JPEG 0\nc/\xff.JPEG 1\n')
    with pytest.raises(ListFileError, match='line 2: not valid UTF-8'):
        build(root)


def test_cache_is_written_reused_and_invalidated(tmp_path, monkeypatch):
    root = make_root(tmp_path, TRICKY)
    ann = osp.join(root, 'meta', 'train.txt')
    cache = ann + '.index'
    first = build(root)
    assert osp.isfile(cache) and isinstance(first._index.paths, np.memmap)
    assert oct(os.stat(cache).st_mode & 0o777) == oct(0o644)
    assert not [n for n in os.listdir(osp.dirname(ann)) if n.endswith('.tmp')]
    written = os.stat(cache).st_mtime_ns

    def no_parse(*args, **kwargs):
        raise AssertionError('the list file was parsed again')

    monkeypatch.setattr(compact_index, 'parse_list_file', no_parse)
    assert records(build(root)) == records(first)  # reused, not re-parsed
    assert os.stat(cache).st_mtime_ns == written
    monkeypatch.undo()

    with open(ann, 'a') as f:  # a new size
        f.write('\nn09/new.JPEG 9\n')
    assert len(build(root)) == 11
    st = os.stat(ann)  # same size, other content and mtime
    with open(ann, 'r+b') as f:
        f.seek(0)
        f.write(b'n99')
    os.utime(ann, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert build(root).get_data_info(0)['img_path'].endswith('n99440764/n01440764_10026.JPEG')

    with open(cache, 'r+b') as f:  # a truncated cache is rebuilt, not trusted
        f.truncate(os.path.getsize(cache) - 8)
    assert records(build(root))[-1][:2] == (osp.join(root, 'train', 'n09/new.JPEG'), 9)

    os.unlink(cache)
    assert len(build(root, index_cache=False)) == 11 and not osp.exists(cache)


def test_unwritable_folder_falls_back_to_memory_with_a_warning(tmp_path, monkeypatch):
    root = make_root(tmp_path, TRICKY)

    def read_only(*args, **kwargs):
        raise OSError(30, 'Read-only file system')

    monkeypatch.setattr(array_file.tempfile, 'mkstemp', read_only)
    with pytest.warns(UserWarning, match='Could not write the list-file index'):
        ds = build(root)
    assert records(ds) == records(build(root, MMPretrainImageNet21k))
    assert not osp.exists(osp.join(root, 'meta', 'train.txt.index'))
    again = pickle.loads(pickle.dumps(ds))  # no cache to point at: the arrays travel
    assert records(again) == records(ds)


def test_pickles_as_a_file_name_and_into_two_spawned_workers(tmp_path):
    lines = ''.join(f'n{c:08d}/n{c:08d}_{i}.JPEG {c}\n' for c in range(50) for i in range(100))
    root = make_root(tmp_path, lines)
    ds = build(root)
    expected = records(ds)
    blob = pickle.dumps(ds)
    assert len(blob) < 4096 < ds._index.paths.nbytes  # the mapped arrays are not in the pickle
    assert records(pickle.loads(blob)) == expected
    # Spawned workers receive the dataset pickled (forked ones share it without pickling).
    loader = DataLoader(ds, batch_size=250, num_workers=2, collate_fn=collate_infos,
                        multiprocessing_context='spawn')
    got = [r for batch in loader for r in batch]
    assert got == expected
    forked = DataLoader(ds, batch_size=250, num_workers=2, collate_fn=collate_infos)
    assert [r for batch in forked for r in batch] == expected


def test_index_refuses_a_cache_changed_under_a_pickle(tmp_path):
    root = make_root(tmp_path, TRICKY)
    ann = osp.join(root, 'meta', 'train.txt')
    blob = pickle.dumps(ListFileIndex.open(ann))
    with open(ann, 'a') as f:
        f.write('\nx/y.JPEG 1')
    ListFileIndex.open(ann)  # rewrites the cache for the new list
    with pytest.raises(RuntimeError, match='changed or vanished'):
        pickle.loads(blob)


def test_imagenet21k_config_builds_through_the_registry(tmp_path):
    from PIL import Image
    root = make_root(tmp_path, 'n01/a.JPEG 0\nn02/b c.JPEG 1\n')
    for name, color in (('n01/a.JPEG', (255, 0, 0)), ('n02/b c.JPEG', (0, 0, 255))):
        os.makedirs(osp.dirname(osp.join(root, 'train', name)), exist_ok=True)
        Image.new('RGB', (40, 30), color).save(osp.join(root, 'train', name))
    cfg = Config.fromfile(osp.join(REPO, 'configs', '_base_', 'datasets', 'imagenet21k.py'))
    block = cfg.train_dataloader.dataset
    assert block.type == 'vit_plugin.ImageNet21k' and block.ann_file == 'meta/train.txt'
    block.data_root = root
    with DefaultScope.overwrite_default_scope('mmpretrain'):  # the config's scope, as its runner sets it
        ds = DATASETS.build(block)
    assert type(ds).__mro__[1] is compact_index.CompactListMixin
    assert [(info['img_path'], info['gt_label']) for info in (ds.get_data_info(i) for i in range(2))] == [
        (osp.join(root, 'train', 'n01/a.JPEG'), 0), (osp.join(root, 'train', 'n02/b c.JPEG'), 1)]
    assert osp.isfile(osp.join(root, 'meta', 'train.txt.index'))
    packed = ds[1]  # the config's full pipeline: load, Inception crop to 224, flip, pack
    assert packed['inputs'].shape == (3, 224, 224) and packed['data_samples'].gt_label.tolist() == [1]
    blue = packed['inputs'].float().mean(dim=(1, 2))  # BGR as decoded: the blue image is channel 0
    assert blue[0] > 200 and blue[2] < 50


def test_folder_layout_still_scans_the_folder(tmp_path):
    from PIL import Image
    for cls, n in (('n01', 2), ('n02', 1)):
        os.makedirs(tmp_path / 'train' / cls)
        for i in range(n):
            Image.new('RGB', (8, 8)).save(tmp_path / 'train' / cls / f'{i}.JPEG')
    ds = ImageNet21k(data_root=str(tmp_path), data_prefix='train', pipeline=[])
    assert ds._index is None and ds.CLASSES == ('n01', 'n02')
    assert [r[1] for r in records(ds)] == [0, 0, 1] and records(ds)[2][0].endswith('n02/0.JPEG')
