"""Checkpoint files (``vit_plugin.engine.checkpointing``): ``last_checkpoint`` is relative to the work
dir, truncated and corrupted files are found and skipped by ``--resume``, and an interrupted write leaves
the previous file."""
import os
import os.path as osp
import shutil
import struct
import zipfile

import pytest
import torch

from vit_plugin.engine.checkpointing import (atomic_write_bytes, checkpoint_problem, find_resumable_checkpoint,
                                             read_last_checkpoint, write_last_checkpoint)


def test_last_checkpoint_is_relative_and_resolves_in_a_moved_work_dir(tmp_path):
    work = tmp_path / 'a'
    work.mkdir()
    (work / 'iter_3.pth').write_bytes(b'x')
    write_last_checkpoint(str(work), str(work / 'iter_3.pth'))
    assert (work / 'last_checkpoint').read_text() == 'iter_3.pth'
    moved = tmp_path / 'b'
    shutil.move(str(work), str(moved))
    assert read_last_checkpoint(str(moved)) == str(moved / 'iter_3.pth')
    # A checkpoint outside the work dir (CheckpointHook(out_dir=...)) keeps its absolute path.
    elsewhere = tmp_path / 'store' / 'iter_5.pth'
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b'x')
    write_last_checkpoint(str(moved), str(elsewhere))
    assert read_last_checkpoint(str(moved)) == str(elsewhere)


def _checkpoint_file(path, value):
    torch.save({'state_dict': {'w': torch.full((256, ), float(value))}, 'meta': {'iter': value}}, path)


def test_checkpoint_problem_finds_truncation_and_corruption(tmp_path):
    good = tmp_path / 'iter_1.pth'
    _checkpoint_file(good, 1)
    assert checkpoint_problem(str(good)) is None
    data = good.read_bytes()
    truncated = tmp_path / 'iter_2.pth'
    truncated.write_bytes(data[:-100])
    assert 'truncated' in checkpoint_problem(str(truncated))
    with zipfile.ZipFile(good) as archive:  # flip one byte inside the tensor data record
        info = next(i for i in archive.infolist() if i.filename.endswith('/data/0'))
    # The local header (30 bytes, then name and extra field, whose lengths it stores at bytes 26-29)
    # precedes the data; torch pads the local extra field, so the central directory's copy differs.
    name_len, extra_len = struct.unpack('<HH', data[info.header_offset + 26:info.header_offset + 30])
    offset = info.header_offset + 30 + name_len + extra_len + 10
    corrupted = bytearray(data)
    corrupted[offset] ^= 0xFF
    (tmp_path / 'iter_3.pth').write_bytes(bytes(corrupted))
    assert 'CRC' in checkpoint_problem(str(tmp_path / 'iter_3.pth'))

    warnings = []
    assert find_resumable_checkpoint(str(tmp_path), warn=warnings.append) == str(good)
    assert [w.split(': it')[0] for w in warnings] == [f'WARNING: --resume skips checkpoint {tmp_path / n}'
                                                      for n in ('iter_3.pth', 'iter_2.pth')]
    os.remove(good)
    with pytest.raises(FileNotFoundError, match='no intact checkpoint'):
        find_resumable_checkpoint(str(tmp_path), warn=None)
    assert find_resumable_checkpoint(str(tmp_path / 'empty'), warn=None) is None


def test_interrupted_write_leaves_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / 'iter_8.pth'
    _checkpoint_file(tmp_path / 'source.pth', 8)
    old = (tmp_path / 'source.pth').read_bytes()
    os.remove(tmp_path / 'source.pth')
    atomic_write_bytes(old, str(target))

    def killed(fd):  # the process dies after writing part of the data, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, 'fsync', killed)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(b'new content that never completes', str(target))
    assert target.read_bytes() == old
    assert osp.isfile(str(target) + '.part')  # the debris has a name --resume never picks
    assert find_resumable_checkpoint(str(tmp_path), warn=None) == str(target)
