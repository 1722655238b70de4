"""Toy tar shards and remote readers for the tests of vit_plugin.datasets.shards: a folder of two shards
with random members, a Hugging Face cache laid out as huggingface_hub writes it, and forked readers."""
import io
import multiprocessing
import os
import random
import tarfile

from vit_plugin.datasets.shards import ShardReader, fingerprint

CHUNK = 64 << 10  # toy chunks: the shards below span several


def make_tar(path, members, seed):
    """A tar of ``members`` files of random sizes and bytes; returns ``[(offset_data, size)]`` of each."""
    rng = random.Random(seed)
    with tarfile.open(path, 'w', format=tarfile.USTAR_FORMAT) as tar:
        for i in range(members):
            data = rng.randbytes(rng.randint(500, 12000))
            info = tarfile.TarInfo(f'n0000{seed}_{i:04d}.jpg')
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        return [(m.offset_data, m.size) for m in tar.getmembers()]


def make_shard_folder(root):
    """Two shards, a compressed tar, a sub-folder and an info file in ``root`` (a pathlib.Path); returns
    ``dict(root, members={name: [(offset, size)]}, data={name: bytes})``."""
    members = {name: make_tar(str(root / name), 60, seed) for seed, name in enumerate(['s0.tar', 's1.tar'])}
    (root / 'old.tar.gz').write_bytes(b'\x1f\x8b not really')
    (root / '_info.json').write_text('{"name": "toy"}')
    (root / 'sub').mkdir()
    (root / 'sub' / 'inner.tar').write_bytes(b'')
    data = {name: (root / name).read_bytes() for name in members}
    return dict(root=str(root), members=members, data=data)


def make_hf_cache(hub, shard: bytes, sha: str):
    """``org/toy-wds`` (dataset) at one commit in the Hugging Face cache ``hub``: ``train/s0.tar`` (``shard``,
    its blob named ``sha``) and ``_info.json``, blobs linked from the snapshot; returns the json's blob id."""
    repo = hub / 'datasets--org--toy-wds'
    commit = 'c' * 40
    (repo / 'refs').mkdir(parents=True)
    (repo / 'refs' / 'main').write_text(commit)
    (repo / 'blobs').mkdir()
    (repo / 'snapshots' / commit / 'train').mkdir(parents=True)
    (repo / 'blobs' / sha).write_bytes(shard)
    os.symlink(f'../../../blobs/{sha}', repo / 'snapshots' / commit / 'train' / 's0.tar')
    blob_id = '1' * 40
    (repo / 'blobs' / blob_id).write_text('{"split": "train"}')
    os.symlink(f'../../blobs/{blob_id}', repo / 'snapshots' / commit / '_info.json')
    return blob_id


def remote_reader(tmp_path, **kwargs):
    settings = dict(cache_dir=str(tmp_path / 'cache'), chunk_bytes=CHUNK, cache_bytes=64 * CHUNK, backoff_s=0.0)
    settings.update(kwargs)
    return ShardReader(**settings)


def chunk_files(folder):
    return sorted(name for _, _, files in os.walk(folder) for name in files
                  if not name.startswith('.') and not name.endswith('.lock'))


def read_every_member(shards, srv, tmp_path, name):
    """Read each member of shard ``name`` through a remote reader, with the server's counts reset first."""
    url = srv.url + '/' + name
    fp = fingerprint(url)
    srv.reset_counts()
    with remote_reader(tmp_path) as reader:
        for off, n in shards['members'][name]:
            reader.read(url, off, n, fp)


def _read_in_child(conn, readers, jobs):
    try:
        conn.send([[r.read(*job) for job in jobs] for r in readers])
    except BaseException as err:  # noqa: BLE001 (sent to the parent, which fails the test with it)
        conn.send(repr(err))
    conn.close()


def run_forked(job_lists, timeout_s=60):
    """Each ``(readers, jobs)`` in a forked child at the same time; what each read (a hang fails the test)."""
    ctx = multiprocessing.get_context('fork')
    pipes, processes = [], []
    for readers, jobs in job_lists:
        parent, child = ctx.Pipe()
        processes.append(ctx.Process(target=_read_in_child, args=(child, readers, jobs)))
        pipes.append(parent)
    for process in processes:
        process.start()
    try:
        got = [pipe.recv() if pipe.poll(timeout_s) else 'no answer: the child hangs' for pipe in pipes]
    finally:
        for process in processes:
            process.join(5)
            if process.is_alive():
                process.kill()
    return got
