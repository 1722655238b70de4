"""Docstrings link ``docs/<page>.md#anchor`` for the story: every such link in the package names a page
and a heading that exist, and ``ViT``'s class docstring stays a contract that links docs/backbone.md."""
import ast
import os
import os.path as osp
import re

import pytest

from helpers.common import REPO

pytestmark = pytest.mark.stack_independent  # this repository's sources only (tests/README.md)

LINK = re.compile(r'docs/([A-Za-z0-9_]+\.md)(?:#([A-Za-z0-9_-]+))?')


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def anchors(page: str) -> set:
    found, fenced = set(), False
    for line in open(osp.join(REPO, 'docs', page), encoding='utf-8'):
        if line.startswith('```'):
            fenced = not fenced
        elif not fenced and line.startswith('#'):
            found.add(github_anchor(line.lstrip('#')))
        found.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
    return found


def package_links():
    for folder, _, files in os.walk(osp.join(REPO, 'vit_plugin')):
        for name in sorted(f for f in files if f.endswith('.py')):
            path = osp.join(folder, name)
            for lineno, line in enumerate(open(path, encoding='utf-8'), 1):
                for page, anchor in LINK.findall(line):
                    yield osp.relpath(path, REPO), lineno, page, anchor


def test_github_anchor_follows_githubs_rule():
    assert github_anchor(" R50+ViT hybrid") == 'r50vit-hybrid'
    assert github_anchor("Every keyword of mmpretrain's VisionTransformer") == \
        'every-keyword-of-mmpretrains-visiontransformer'
    assert github_anchor('Export to ONNX (tools/deployment/export_onnx.py)') == \
        'export-to-onnx-toolsdeploymentexport_onnxpy'


def test_every_docs_link_in_the_package_resolves():
    broken, cache = [], {}
    for path, lineno, page, anchor in package_links():
        if not osp.isfile(osp.join(REPO, 'docs', page)):
            broken.append(f'{path}:{lineno}: docs/{page} does not exist')
        elif anchor and anchor not in cache.setdefault(page, anchors(page)):
            broken.append(f'{path}:{lineno}: docs/{page} has no heading with anchor #{anchor}')
    assert not broken, '\n'.join(broken)


def test_vit_class_docstring_is_a_contract_that_links_the_story():
    tree = ast.parse(open(osp.join(REPO, 'vit_plugin', 'models', 'backbones', 'vit.py'), encoding='utf-8').read())
    vit = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == 'ViT')
    doc = vit.body[0]
    assert doc.end_lineno - doc.lineno + 1 <= 30
    text = ast.get_docstring(vit)
    assert 'docs/backbone.md' in text
    assert 'Args:' in text and 'Raises:' in text
