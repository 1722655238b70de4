"""Crash-safe checkpoints: atomic writes, a work-dir-relative ``last_checkpoint``, and a ``--resume``
that skips damaged files. See docs/configs.md#training-and-testing ("Pre-emption-safe runs").
"""
import os
import os.path as osp
import re
import zipfile
from typing import Callable, List, Optional

from mmengine.dist import is_main_process
from mmengine.fileio import LocalBackend, register_backend
from mmengine.hooks import CheckpointHook

from vit_plugin.compat import mmengine as mmengine_compat
from vit_plugin.checkpoint.safe_load import CheckpointError, load_local_checkpoint
from vit_plugin.registry import HOOKS

#: Name of the file in which mmengine's CheckpointHook records the newest checkpoint.
LAST_CHECKPOINT = 'last_checkpoint'
#: Suffix of a file being written; it is renamed to its final name only once complete.
PARTIAL_SUFFIX = '.part'
#: Suffix of a complete sharded checkpoint directory moved aside while a new one takes its name
#: (:func:`vit_plugin.engine.fsdp2.commit_directory`); a resume point only when the name is missing.
ASIDE_SUFFIX = '.old'
ATOMIC_BACKEND = 'vit_plugin_atomic_local'
#: Periodic/last runner checkpoints (``iter_N.pth``, ``epoch_N.pth``); ``best_*`` files are not resume points.
_CHECKPOINT_NAME = re.compile(r'^(iter|epoch)_(\d+)\.pth$')
#: File marking a sharded checkpoint directory as complete (written last, by rank 0).
COMPLETE_MARKER = '.complete'
#: The non-tensor part of a sharded checkpoint (meta, schedulers, message hub).
EXTRA_FILE = 'extra.pth'
_ASIDE_NAME = re.compile(r'^((?:iter|epoch)_(\d+)\.pth)' + re.escape(ASIDE_SUFFIX) + '$')


def atomic_write_bytes(data: bytes, path: str) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either its old or its complete new content."""
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    partial = path + PARTIAL_SUFFIX
    with open(partial, 'wb') as f:
        f.write(data)
    publish_partial(partial, path)


def publish_partial(partial: str, path: str) -> None:
    """Flush the complete file ``partial`` and rename it over ``path``, durably (directory entry flushed)."""
    with open(partial, 'rb+') as f:
        os.fsync(f.fileno())
    os.replace(partial, path)
    fsync_directory(osp.dirname(osp.abspath(path)))


def fsync_directory(directory: str) -> None:
    """Flush the entries of ``directory`` (renames into it) to disk, where the file system allows."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. a file system that cannot open directories; the rename itself is done
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@register_backend(ATOMIC_BACKEND)
class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend whose ``put``/``put_text`` write atomically."""

    def put(self, obj: bytes, filepath) -> None:
        atomic_write_bytes(obj, str(filepath))

    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        atomic_write_bytes(obj.encode(encoding), str(filepath))


def write_last_checkpoint(work_dir: str, checkpoint: str) -> None:
    """Record ``checkpoint`` in ``<work_dir>/last_checkpoint`` atomically, relative to the work dir if inside it."""
    work_dir = osp.abspath(work_dir)
    path = osp.abspath(checkpoint)
    if osp.commonpath([work_dir, path]) == work_dir:
        path = osp.relpath(path, work_dir)
    atomic_write_bytes(path.encode(), osp.join(work_dir, LAST_CHECKPOINT))


def read_last_checkpoint(work_dir: str) -> Optional[str]:
    """The existing checkpoint ``last_checkpoint`` names, preferring a same-named file in ``work_dir``; or None."""
    record = osp.join(work_dir, LAST_CHECKPOINT)
    if not osp.isfile(record):
        return None
    with open(record) as f:
        entry = f.read().strip()
    if not entry:
        return None
    if not osp.isabs(entry):
        entry = osp.join(work_dir, entry)
    local = osp.join(work_dir, osp.basename(entry.rstrip(os.sep)))
    if osp.exists(local):
        return local
    return entry if osp.exists(entry) else None


def checkpoint_candidates(work_dir: str) -> List[str]:
    """Resume points of ``work_dir``, newest first (``iter_N``/``epoch_N``, orphaned ``.old``, ``last_checkpoint``)."""
    found = {}
    if osp.isdir(work_dir):
        names = set(os.listdir(work_dir))
        for name in names:
            match = _CHECKPOINT_NAME.match(name)
            path = osp.join(work_dir, name)
            if match and osp.exists(path):
                found[path] = int(match.group(2))
            aside = _ASIDE_NAME.match(name)
            if aside and aside.group(1) not in names and osp.isdir(path):
                found[path] = int(aside.group(2))
    recorded = read_last_checkpoint(work_dir)
    if recorded is not None and recorded not in found:
        match = _CHECKPOINT_NAME.match(osp.basename(recorded))
        found[recorded] = int(match.group(2)) if match else -1
    return sorted(found, key=lambda p: (found[p], osp.getmtime(p)), reverse=True)


def is_sharded_checkpoint(path: str) -> bool:
    """Whether ``path`` is a sharded (DCP) checkpoint directory written by ``vit_plugin.FSDP2Strategy``."""
    return osp.isdir(path) and osp.isfile(osp.join(path, EXTRA_FILE))


def sharded_checkpoint_problem(path: str) -> Optional[str]:
    """Why the sharded checkpoint directory ``path`` cannot be resumed from, or None when complete."""
    missing = [name for name in (COMPLETE_MARKER, EXTRA_FILE) if not osp.isfile(osp.join(path, name))]
    if missing:
        return (f'is an incomplete sharded checkpoint (no {" or ".join(missing)}: its save was '
                f'interrupted)')
    return None


def checkpoint_problem(path: str) -> Optional[str]:
    """Why the checkpoint ``path`` cannot be loaded, or None when intact (zip CRCs checked, nothing unpickled)."""
    if osp.isdir(path):  # a sharded checkpoint (vit_plugin.engine.fsdp2): complete once renamed and marked
        return sharded_checkpoint_problem(path)
    try:
        with open(path, 'rb') as f:
            magic = f.read(4)
    except OSError as err:
        return f'cannot be read ({err})'
    if magic == b'PK\x03\x04':
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            return f'is truncated or not a complete zip archive ({err})'
        except Exception as err:  # zlib errors of damaged compressed records, among others
            return f'is corrupt ({type(err).__name__}: {err})'
        return None if bad is None else f'is corrupt (record {bad!r} fails its CRC check)'
    try:
        load_local_checkpoint(path, map_location='cpu')
    except CheckpointError as err:
        return f'cannot be loaded ({err})'
    return None


def find_resumable_checkpoint(work_dir: str, warn: Optional[Callable[[str], None]] = print) -> Optional[str]:
    """The newest intact checkpoint of ``work_dir`` (``warn`` gets each one skipped), None if it has none.

    Raises:
        FileNotFoundError: The work dir has checkpoints, none of them intact.
    """
    candidates = checkpoint_candidates(work_dir)
    skipped = []
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        skipped.append(f'{path} {problem}')
        if warn is not None:
            warn(f'WARNING: --resume skips checkpoint {path}: it {problem}. Trying the next older one.')
    if skipped:
        raise FileNotFoundError(
            f'--resume found no intact checkpoint in {work_dir}: ' + '; '.join(skipped)
            + '. Give an intact checkpoint explicitly with --resume PATH, or start again without --resume.')
    return None


@HOOKS.register_module()
class AtomicCheckpointHook(mmengine_compat.AfterCheckpointSaved, CheckpointHook):
    """mmengine's ``CheckpointHook`` (same arguments) with atomic local files and a relative ``last_checkpoint``."""

    def before_train(self, runner) -> None:
        target = self.out_dir or runner.work_dir
        if (self.backend_args is None and self.file_client_args is None
                and mmengine_compat.is_local_uri(target)):
            self.backend_args = dict(backend=ATOMIC_BACKEND)
        super().before_train(runner)

    def after_checkpoint_saved(self, runner) -> None:
        if is_main_process() and mmengine_compat.is_local_uri(self.last_ckpt):
            write_last_checkpoint(runner.work_dir, self.last_ckpt)
