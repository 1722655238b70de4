"""Building the tar-shard index: scans on every core, kept parts, one builder per lock, the others waiting.

docs/data.md#the-index tells how a build resumes, shares and reports.
"""
import errno
import hashlib
import json
import multiprocessing
import os
import os.path as osp
import shutil
import time
from typing import Dict, Iterator, List, Optional, Tuple, Union

import numpy as np
from mmengine.logging import print_log

from vit_plugin import runtime
from vit_plugin.datasets.array_file import SpooledArray, read_array_file, read_array_header, write_array_file
from vit_plugin.datasets.shards import RetryPolicy, ShardReader, ShardReadError, is_remote
from vit_plugin.datasets.tar_scan import (STORE_ERRORS, LabelRule, Scan, TarIndexError, all_problems, inner_tars,
                                         scan_inner_tar, scan_webdataset, split_key)
from vit_plugin.datasets.tar_shards import ShardList

_PROGRESS_S = 10.0
_WAIT_LOG_S = 60.0  # a waiting process's progress line
_POLL_S = 1.0  # how often a waiting process looks for the finished index


def _run_task(task: tuple) -> Tuple[int, Union[Scan, TarIndexError]]:
    """One unit of the build, in a worker process: ``(position, scan)``, or ``(position, error)`` for a bad
    shard (the build goes on and reports them all).

    Raises:
        TarIndexError: the store cannot be reached (past the retry policy) or ignores byte ranges: every
            other shard would fail the same way.
    """
    position, _, kind, url, args = task[:5]
    retry = task[5] if len(task) > 5 else None
    keep = task[6] if len(task) > 6 else None
    try:
        try:
            if kind == 'shard':
                return position, scan_webdataset(url, args, retry, keep)
            return position, scan_inner_tar(url, *args, retry, keep)
        finally:
            if keep is not None:
                keep[0].close()  # this process's read-ahead threads finish their chunks
    except TarIndexError as err:
        return position, err
    except STORE_ERRORS as err:
        raise TarIndexError(f'{err}') from None
    except ShardReadError as err:
        return position, TarIndexError(f'{url}: cannot be read ({err.reason or err}); check the path and the '
                                       f'permissions, or download the shard again')
    except OSError as err:
        return position, TarIndexError(f'{url}: cannot be read ({err}); check the path and the permissions')



def _tasks(shards: ShardList, layout: str, rule: LabelRule, retry: Optional[RetryPolicy] = None,
           keeps: Optional[List[Optional[tuple]]] = None) -> Tuple[List[tuple], List[str]]:
    """The units of the build, in row order: ``(position, shard, kind, url, args, retry, keep)``; and the
    problems of the outer tars that could not be listed. ``keeps[i]``: ``(reader, fingerprint)`` to scan
    shard ``i`` through the reader's chunk cache, or None."""
    keeps = keeps or [None] * len(shards.names)
    if layout == 'webdataset':
        return [(i, i, 'shard', shards.url(i), rule, retry, keeps[i]) for i in range(len(shards.names))], []
    tasks, problems = [], []
    for i in range(len(shards.names)):
        try:
            try:
                inner = inner_tars(shards.url(i), retry, keeps[i])
            finally:
                if keeps[i] is not None:
                    keeps[i][0].close()  # no read-ahead thread runs when the workers fork
        except TarIndexError as err:
            problems.append(str(err))
            continue
        except STORE_ERRORS as err:
            raise TarIndexError(f'{err}') from None
        except ShardReadError as err:
            problems.append(f'{shards.url(i)}: cannot be read ({err.reason or err}); download it again')
            continue
        for name, start, size in inner:
            tasks.append((len(tasks), i, 'inner', shards.url(i), (start, size, name), retry, keeps[i]))
    return tasks, problems


def _scans(tasks: List[tuple], workers: int) -> Iterator[Tuple[int, Scan]]:
    """The scans in task order, from ``workers`` processes (forked: the tasks need nothing from the
    training process, and forking costs no import)."""
    if workers <= 1 or len(tasks) <= 1:
        yield from map(_run_task, tasks)
        return
    context = multiprocessing.get_context('fork')
    # Objects the collector never visits are never written to, so the workers share the parent's heap
    # pages instead of copying them (measured: 169 -> 11 MiB of private memory per worker).
    # The workers end under SIGTERM whatever handler the training process installed (pre-emption), also
    # one that a terminating pool signals while it still starts.
    with runtime.frozen_heap():
        with runtime.stops_held():
            pool = context.Pool(workers, initializer=runtime.default_stop_signals)
        try:
            yield from pool.imap(_run_task, tasks, chunksize=1)
        except BaseException:  # an error, Ctrl-C, or the consumer stopping early
            pool.terminate()
            raise
        else:
            pool.close()  # every task done: the workers leave on their own
        finally:
            pool.join()


def _build(path: str, shards: ShardList, layout: str, rule: LabelRule, fields: dict,
           workers: Optional[int], retry: Optional[RetryPolicy] = None, keep_in: Optional[ShardReader] = None,
           why: str = 'no index yet') -> None:
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    parts = parts_folder(path)
    keeps = _keeps(shards, fields['fingerprints'], keep_in)
    tasks, problems = _tasks(shards, layout, rule, retry, keeps)
    part_files = [osp.join(parts, _part_name(task, fields['fingerprints'][task[1]], layout, rule,
                                             fields['version'])) for task in tasks]
    earlier = {i: part for i, part in enumerate(part_files) if osp.exists(part)}
    todo = [task for i, task in enumerate(tasks) if i not in earlier]
    bad_shards = set()
    workers = workers or os.cpu_count() or 1
    spooled = {'names': SpooledArray(np.uint8, folder), 'name_offsets': SpooledArray(np.int64, folder),
               'offsets': SpooledArray(np.int64, folder), 'sizes': SpooledArray(np.int64, folder),
               'labels': SpooledArray(np.int32, folder)}
    key_hashes: List[np.ndarray] = []
    synset_ids: Dict[str, int] = {}
    listed = None if rule.synsets is None else {s: i for i, s in enumerate(rule.synsets)}
    shard_counts = [0] * len(shards.names)
    total, name_bytes, started, last = 0, 0, time.time(), time.time()
    spooled['name_offsets'].append(np.zeros(1, np.int64))
    unit = 'shards' if layout == 'webdataset' else 'inner tars'
    resumed = f'; {len(earlier):,} scanned by an earlier build, kept in {parts}' if earlier else ''
    kept = sum(k is not None for k in keeps)
    cached = (f'; {kept:,} of {len(keeps):,} shards scanned through the chunk cache {keep_in.cache_root}'
              if kept else '')
    print_log(f'Indexing {len(tasks):,} {unit} of {shards.data_root} with {min(workers, max(1, len(todo)))} '
              f'processes '
              f'({why}; the index goes to {path}{resumed}{cached})', logger='current')
    os.makedirs(parts, exist_ok=True)
    scans = _scans(todo, workers)
    try:
        for done, task in enumerate(tasks, 1):
            position, shard, _, url = task[:4]
            if position in earlier:
                scan = _load_part(earlier[position])
                if scan is None:  # unreadable: scan it again, here
                    scan = _run_task(task)[1]
            else:
                scan = next(scans)[1]
                if not isinstance(scan, TarIndexError):
                    _save_part(part_files[position], scan)
            if isinstance(scan, TarIndexError):  # a bad shard: noted, and the others scanned
                problems.append(str(scan))
                bad_shards.add(shard)
                continue
            n = len(scan.names)
            if rule.source == 'synset':
                if listed is not None:
                    labels = [listed.get(s, -1) for s in scan.synsets]
                    if -1 in labels:
                        at = labels.index(-1)
                        problems.append(f'{url}, sample {scan.names[at].decode()!r}: synset {scan.synsets[at]} '
                                        f'is not in the label space ({len(rule.synsets):,} classes); choose '
                                        f'the label space of this release')
                        bad_shards.add(shard)
                        continue
                else:  # provisional numbers in order of appearance, sorted at the end
                    labels = [synset_ids.setdefault(s, len(synset_ids)) for s in scan.synsets]
            else:
                labels = scan.labels
            lengths = np.fromiter((len(b) for b in scan.names), np.int64, n)
            spooled['names'].append(np.frombuffer(b''.join(scan.names), np.uint8))
            spooled['name_offsets'].append(name_bytes + np.cumsum(lengths))
            spooled['offsets'].append(np.asarray(scan.offsets, np.int64))
            spooled['sizes'].append(np.asarray(scan.sizes, np.int64))
            spooled['labels'].append(np.asarray(labels, np.int64))
            key_hashes.append(_key_hashes(scan.names))
            name_bytes += int(lengths.sum())
            total += n
            shard_counts[shard] += n
            if time.time() - last > _PROGRESS_S:
                last = time.time()
                fresh = done - sum(1 for p in earlier if p < done)
                rate = fresh / (last - started) if fresh else 0.0
                left = (f', about {_duration((len(tasks) - done) / rate)} left' if rate else '')
                print_log(f'Indexing: {done:,}/{len(tasks):,} {unit}, {total:,} samples, '
                          f'{_duration(last - started)}{left}', logger='current')
        if shards.counts is not None:
            for i, (have, want) in enumerate(zip(shard_counts, shards.counts)):
                if have != want and i not in bad_shards:
                    problems.append(f'{shards.url(i)}: {have:,} samples, but {shards.info_file} says {want:,}; '
                                    f'the shard is truncated or replaced: download it again')
        if problems:
            raise all_problems(problems, shards.data_root)
        if total == 0:
            raise TarIndexError(f'{shards.data_root}: the shards hold no sample; check data_root and shards')
        synsets = rule.synsets
        if rule.source == 'synset' and listed is None:
            synsets = tuple(sorted(synset_ids))
            rank = {s: i for i, s in enumerate(synsets)}
            order = np.empty(len(synset_ids), np.int32)
            for s, provisional in synset_ids.items():
                order[provisional] = rank[s]
            labels = SpooledArray(np.int32, folder)
            try:
                for chunk in spooled['labels'].chunks():
                    labels.append(order[chunk])
            except BaseException:
                labels.close()
                raise
            spooled['labels'].close()
            spooled['labels'] = labels
        arrays = dict(spooled)
        arrays['shard_starts'] = np.concatenate([[0], np.cumsum(shard_counts)]).astype(np.int64)
        count, rows = _duplicates(np.concatenate(key_hashes))
        fields = dict(fields, synsets=list(synsets) if synsets is not None and listed is None else None,
                      num_samples=total, duplicate_keys={'count': count, 'rows': rows})
        write_array_file(path, fields, arrays)
    finally:
        scans.close()  # its pool of workers ends, however the loop ended
        for array in spooled.values():
            array.close()
        if osp.isdir(parts) and not os.listdir(parts):
            os.rmdir(parts)
    shutil.rmtree(parts, ignore_errors=True)  # the index holds it all
    print_log(f'Indexed {total:,} samples of {len(shards.names):,} shards in {time.time() - started:.1f} s',
              logger='current')



def parts_folder(index_path: str) -> str:
    """Where a build keeps each scanned shard's rows until the index is written (``<index>.parts``): a
    build stopped for any reason (killed, bad shards) scans only the shards not done, or changed, when it
    starts again."""
    return index_path + '.parts'


def _part_name(task: tuple, version: dict, layout: str, rule: LabelRule, format_version: int) -> str:
    """A scan's file in :func:`parts_folder`: named by the shard's URL and fingerprint, the unit of the
    shard (an inner tar's place), the layout and the label rule."""
    _, _, kind, url, args = task[:5]
    what = [format_version, url, version, kind, list(args) if kind == 'inner' else None, layout, rule.describe()]
    return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24] + '.npz'


def _save_part(path: str, scan: Scan) -> None:
    """A scan's rows, written whole or not at all (a temporary name moved into place)."""
    arrays = {'names': np.frombuffer(b''.join(scan.names), np.uint8),
              'lengths': np.fromiter((len(b) for b in scan.names), np.int64, len(scan.names)),
              'offsets': np.asarray(scan.offsets, np.int64), 'sizes': np.asarray(scan.sizes, np.int64),
              'labels': np.asarray(scan.labels, np.int64),
              'synsets': np.frombuffer('\n'.join(scan.synsets).encode(), np.uint8)}
    tmp = f'{path}.{os.getpid()}.tmp'
    try:
        with open(tmp, 'wb') as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except OSError:  # a full disk costs the resumability of this shard, not the build
        if osp.exists(tmp):
            os.unlink(tmp)


def _load_part(path: str) -> Optional[Scan]:
    try:
        with np.load(path, allow_pickle=False) as z:
            names, lengths = z['names'].tobytes(), z['lengths']
            scan = Scan()
            scan.offsets, scan.sizes, scan.labels = z['offsets'].tolist(), z['sizes'].tolist(), z['labels'].tolist()
            synsets = z['synsets'].tobytes().decode()
    except (OSError, ValueError, KeyError, EOFError):
        return None
    ends = np.cumsum(lengths).tolist()
    scan.names = [names[a:b] for a, b in zip([0] + ends[:-1], ends)]
    scan.synsets = synsets.split('\n') if synsets else []
    return scan


def _keeps(shards: ShardList, versions: List[dict], keep_in: Optional[ShardReader]) -> List[Optional[tuple]]:
    """``(reader, fingerprint)`` for the remote shards, in order, that fit the reader's cache together
    (:meth:`ShardReader.scan_room`); None for the others, scanned past the cache."""
    keeps: List[Optional[tuple]] = [None] * len(shards.names)
    if keep_in is None:
        return keeps
    room = keep_in.scan_room()
    for i, version in enumerate(versions):
        size = int(version.get('size') or 0)
        if not is_remote(shards.url(i)) or size > room:
            break
        room -= size
        keeps[i] = (keep_in, version)
    return keeps


def _key_hashes(names: List[bytes]) -> np.ndarray:
    """A 64-bit hash of each sample's key (:meth:`TarShardIndex.key`)."""
    out = np.empty(len(names), np.uint64)
    for i, name in enumerate(names):
        key = split_key(name.rpartition(b'/')[2].decode('utf-8', 'replace'))[0]
        out[i] = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), 'little')
    return out


def _duplicates(hashes: np.ndarray, examples: int = 5) -> Tuple[int, List[List[int]]]:
    """The number of rows whose key an earlier row has, and ``[earlier row, row]`` of the first few."""
    order = np.argsort(hashes, kind='stable')
    ordered = hashes[order]
    same = ordered[1:] == ordered[:-1]
    count = int(same.sum())
    if not count:
        return 0, []
    repeats = np.sort(order[1:][same])[:examples]
    return count, [[int(order[np.searchsorted(ordered, hashes[r])]), int(r)] for r in repeats]


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f'{seconds} s'
    if seconds < 7200:
        return f'{seconds // 60} min {seconds % 60:02d} s'
    return f'{seconds // 3600} h {seconds % 3600 // 60:02d} min'


def _why_rebuilt(path: str, expect: dict) -> str:
    """Why the index at ``path`` does not serve ``expect``: missing, damaged, other settings, or the
    shards that changed (size, modification time or version), were added or removed."""
    if not osp.exists(path):
        return 'no index yet'
    header = read_array_header(path)
    if header is None:
        return f'{path} is damaged'
    for key in ('kind', 'version', 'layout', 'label', 'base'):
        if header.get(key) != expect[key]:
            return f'rebuilt: its {key} was {header.get(key)!r}, the dataset has {expect[key]!r}'
    old = dict(zip(header.get('shards') or [], header.get('fingerprints') or []))
    new = dict(zip(expect['shards'], expect['fingerprints']))
    changes = []
    for name, version in new.items():
        before = old.get(name)
        if before is None:
            changes.append(f'{name} added')
        elif before != version:
            changed = ', '.join(f'{k} {before.get(k)} -> {version.get(k)}' for k in sorted(set(before) | set(version))
                                if before.get(k) != version.get(k))
            changes.append(f'{name} changed ({changed})')
    changes += [f'{name} removed' for name in old if name not in new]
    if not changes:
        return 'rebuilt: the shards are listed in another order' if list(old) != list(new) else f'{path} is damaged'
    more = f'; and {len(changes) - 3:,} more' if len(changes) > 3 else ''
    return f'rebuilt: {len(changes):,} shard(s) differ: ' + '; '.join(changes[:3]) + more


class _BuildLock:
    """A non-blocking exclusive lock on ``<index>.lock``: the one process (of every process that can see
    the file, on every node of a shared file system) that holds it builds; the lock goes with its process."""

    def __init__(self, path: str):
        self.path, self.fd = path, -1

    def acquire(self) -> bool:
        """True when this process holds the lock, or the file system takes no locks (then each builds)."""
        import fcntl  # POSIX only
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return True
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            return err.errno not in (errno.EACCES, errno.EAGAIN)
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def build_or_wait(path: str, shards: ShardList, layout: str, rule: LabelRule, expect: dict, workers: Optional[int],
                   retry: Optional[RetryPolicy], keep_in: Optional[ShardReader], wait_s: Optional[float],
                   rebuild: bool):
    """Build the index, or wait for the process that builds it: polling the file (no collective, so no
    process group's timeout applies), logging that build's progress, for up to ``wait_s`` seconds. A
    waiter whose builder died takes the build over, from what it scanned."""
    why = 'a rebuild was asked for' if rebuild else _why_rebuilt(path, expect)
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    lock = _BuildLock(path + '.lock')
    started, logged, seen = time.time(), 0.0, None
    while True:
        if lock.acquire():
            try:
                found = None if rebuild else read_array_file(path, expect)
                if found is None:
                    _build(path, shards, layout, rule, expect, workers, retry, keep_in, why)
                    found = read_array_file(path, expect)
                    if found is None:
                        raise TarIndexError(f'{path}: the index changed while it was opened (a shard was '
                                            f'replaced meanwhile?); start again')
                return found
            finally:
                lock.release()
        found = read_array_file(path, expect)
        if found is not None:
            return found
        now = time.time()
        parts = parts_folder(path)
        done = len([n for n in os.listdir(parts) if n.endswith('.npz')]) if osp.isdir(parts) else 0
        seen = (now, done) if seen is None else seen
        if wait_s is not None and now - started > wait_s:
            raise TarIndexError(f'{path}: waited {_duration(now - started)} (index_wait_s) for another process '
                                f'to build it ({done:,} done).\nBuild it ahead with `python tools/build_index.py '
                                f'CONFIG`, or raise index_wait_s.')
        if now - logged >= _WAIT_LOG_S:
            logged = now
            rate = (done - seen[1]) / (now - seen[0]) if now > seen[0] else 0.0
            if layout == 'webdataset':
                left = f', about {_duration((len(shards.names) - done) / rate)} left' if rate > 0 else ''
                progress = f'{done:,}/{len(shards.names):,} shards done{left}'
            else:
                progress = f'{done:,} inner tars done'
            print_log(f'Waiting for another process to build the index {path} ({why}): {progress}; '
                      f'{_duration(now - started)} waited of index_wait_s={wait_s}', logger='current')
        time.sleep(_POLL_S)



__all__ = ['parts_folder', 'build_or_wait']
