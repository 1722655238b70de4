"""Records served from an index keep mmengine's meaning of indices, subsets and labels; a dataset without
an index serves its base class's records; the label-range check names the row, the label and the range."""
import numpy as np
import pytest
from mmpretrain.datasets import BaseDataset

from vit_plugin.datasets.indexed import FromDataList, FromIndex, IndexedRecordsMixin, check_label_range

LABELS = np.array([3, 0, 2, 1, 3], dtype=np.int32)


class Index:
    labels = LABELS

    def __len__(self):
        return len(self.labels)


class Toy(IndexedRecordsMixin, BaseDataset):
    def __init__(self, reads_index=True, **kwargs):
        self.reads_index = reads_index
        super().__init__(ann_file='', **kwargs)

    def _reads_index(self):
        return self.reads_index

    def _open_index(self):
        return Index()

    def _record(self, row):
        return {'row': row, 'gt_label': int(LABELS[row])}

    def load_data_list(self):  # the base class's records, as a folder layout gives them
        return [{'row': row, 'gt_label': int(label)} for row, label in enumerate(LABELS)]


def served(dataset):
    return [(info['row'], info['gt_label'], info['sample_idx'])
            for info in map(dataset.get_data_info, range(len(dataset)))]


@pytest.mark.parametrize('reads_index', [True, False], ids=['index', 'data-list'])
def test_indices_subsets_and_labels_as_mmengine_gives_them(reads_index):
    full = Toy(reads_index)
    assert type(full._records) is (FromIndex if reads_index else FromDataList)
    assert served(full) == [(0, 3, 0), (1, 0, 1), (2, 2, 2), (3, 1, 3), (4, 3, 4)]
    last = Toy(reads_index, indices=-2)
    assert served(last) == [(3, 1, 0), (4, 3, 1)] and last.get_gt_labels().tolist() == [1, 3]
    picked = full.get_subset([4, 1])
    assert [info['row'] for info in map(picked.get_data_info, range(2))] == [4, 1]
    assert picked.get_cat_ids(0) == [3] and len(full) == 5  # the original keeps its samples
    full.get_subset_(2)
    assert full.get_gt_labels().tolist() == [3, 0]


def test_a_subclass_without_its_record_cannot_be_built():
    class NoRecord(IndexedRecordsMixin, BaseDataset):
        def _open_index(self):
            return Index()

    with pytest.raises(TypeError, match='abstract'):
        NoRecord(ann_file='')


def test_the_label_range_check_names_the_first_row_outside():
    check_label_range(LABELS, 4, str)
    for labels, num_classes, first in ((LABELS, 3, 0), (np.array([1, -1, 5]), 6, 1)):
        with pytest.raises(KeyError) as err:
            check_label_range(labels, num_classes, lambda row: f'row {row}', KeyError)
        text = err.value.args[0]
        assert text.startswith(f'row {first}: label {labels[first]} is outside [0, {num_classes})')
        assert 'Set num_classes' in text
    with pytest.raises(ValueError, match='positive int'):
        check_label_range(LABELS, True, str)
