"""``vit_plugin.apis`` gathers the Python API (docs/model_zoo.md, docs/inference.md): each name is the very
object of its home module, so code importing either path shares one model table and one class."""
import vit_plugin.apis as apis
from vit_plugin import inference, zoo


def test_each_name_is_its_home_modules_object():
    homes = {name: getattr(zoo, name, None) or getattr(inference, name) for name in apis.__all__}
    assert {name: getattr(apis, name) for name in apis.__all__} == homes
    # mmpretrain.apis' model-by-name and inferencer entries, and mmdet's inferencer (both stacks install mmdet)
    assert {'get_model', 'list_models', 'CheckedImageClassificationInferencer', 'CheckedDetInferencer'} <= set(
        apis.__all__)
