"""Every vit_plugin component resolves as ``vit_plugin.X`` from mmpretrain- and mmdet-scoped configs."""
import ast
import glob
import os.path as osp

import pytest
from mmengine.registry import DefaultScope, Registry
from mmengine.registry import init_default_scope

import vit_plugin
from vit_plugin import registry as ours

OUR_REGISTRIES = {name: obj for name, obj in vars(ours).items()
                  if isinstance(obj, Registry) and not name.startswith('MMENGINE_')}
HOSTS = ('mmpretrain', 'mmdet')


def _host_registry(host, name):
    module = __import__(f'{host}.registry', fromlist=[name])
    return getattr(module, name, None)


def test_every_registry_is_a_direct_child_of_mmengine_root():
    import mmengine.registry as root
    for name, reg in OUR_REGISTRIES.items():
        assert reg.scope == 'vit_plugin'
        assert reg.parent is getattr(root, name), name
        assert reg.parent.parent is None, f'{name}: parent must be a root registry'
        assert reg.parent._search_child('vit_plugin') is reg


def _decorated_components():
    """(registry, name) of every class or function that the package's source decorates with
    ``@REGISTRY.register_module()``, read from the files themselves. The XLA path registers its
    components when it is imported (it needs torch_xla), so it is left out."""
    package = osp.dirname(vit_plugin.__file__)
    found = set()
    for path in glob.glob(osp.join(package, '**', '*.py'), recursive=True):
        if osp.relpath(path, package).startswith('xla'):
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                continue
            for deco in node.decorator_list:
                if (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute)
                        and deco.func.attr == 'register_module' and isinstance(deco.func.value, ast.Name)):
                    names = [k.value.value for k in deco.keywords if k.arg == 'name']
                    found.add((deco.func.value.id, names[0] if names else node.name))
    return found


def test_importing_the_package_registers_every_decorated_component():
    # A module that `import vit_plugin` does not reach leaves its components unregistered, and a
    # config naming them fails with "not in the vit_plugin registry".
    components = _decorated_components()
    assert {('MODELS', 'ViT'), ('HOOKS', 'RNGReseedHook'), ('DATASETS', 'DigitsDataset')} <= components
    missing = sorted((reg, name) for reg, name in components if name not in getattr(ours, reg).module_dict)
    assert not missing, f'decorated but not registered by `import vit_plugin`: {missing}'


@pytest.mark.parametrize('host', HOSTS)
def test_every_registered_name_resolves_from_host_scope(host):
    checked = 0
    for reg_name, reg in OUR_REGISTRIES.items():
        host_reg = _host_registry(host, reg_name)
        if host_reg is None:
            continue
        for type_name, cls in list(reg.module_dict.items()):
            with DefaultScope.overwrite_default_scope(host):
                assert host_reg.get(f'vit_plugin.{type_name}') is cls, (host, reg_name, type_name)
            checked += 1
    assert checked >= len(ours.MODELS.module_dict)


@pytest.mark.parametrize('host', HOSTS)
def test_build_vit_from_host_config_with_custom_imports(host, tmp_path):
    from mmengine.config import Config
    cfg_file = tmp_path / 'cfg.py'
    cfg_file.write_text(
        f"default_scope = '{host}'\n"
        "custom_imports = dict(imports=['vit_plugin'], allow_failed_imports=False)\n"
        "model = dict(type='vit_plugin.ViT', arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64),\n"
        "             img_size=32, patch_size=8)\n")
    cfg = Config.fromfile(str(cfg_file))
    init_default_scope(cfg.default_scope)
    host_models = _host_registry(host, 'MODELS')
    model = host_models.build(cfg.model)
    assert isinstance(model, vit_plugin.models.ViT)
    assert model.pos_embed.shape == (1, 17, 32)


def test_unprefixed_nested_types_resolve_in_the_host_scope():
    # Building through our registry under the mmpretrain default scope switches to mmpretrain's
    # registry, so configs can name mmpretrain types without a prefix inside our components.
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        with ours.MODELS.switch_scope_and_registry(None) as reg:
            assert reg.scope == 'mmpretrain'
            assert reg.get('vit_plugin.ViT') is vit_plugin.models.ViT
