"""A Hugging Face hub cache made by hand: a repository's files laid out as ``huggingface_hub`` lays out a
download (``models--org--name/{blobs,snapshots/<commit>,refs/main}``), for the tests that read ``hf-hub:``
ids offline."""
import hashlib
import os
import os.path as osp
import shutil

COMMIT = '0123456789abcdef0123456789abcdef01234567'


def hub_cache(cache, repo_id, folder, commit=COMMIT):
    """Put the files of ``folder`` into ``cache`` as huggingface_hub lays a downloaded repository out."""
    repo = osp.join(cache, 'models--' + repo_id.replace('/', '--'))
    os.makedirs(osp.join(repo, 'blobs'), exist_ok=True)
    os.makedirs(osp.join(repo, 'snapshots', commit), exist_ok=True)
    os.makedirs(osp.join(repo, 'refs'), exist_ok=True)
    for name in os.listdir(folder):
        with open(osp.join(folder, name), 'rb') as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        shutil.copy(osp.join(folder, name), osp.join(repo, 'blobs', digest))
        os.symlink(osp.join('..', '..', 'blobs', digest), osp.join(repo, 'snapshots', commit, name))
    with open(osp.join(repo, 'refs', 'main'), 'w') as f:
        f.write(commit)
