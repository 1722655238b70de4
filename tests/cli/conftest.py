"""The tiny ViT checkpoint that the figure tools' tests run on (``helpers/figure_tools.py``)."""
import pytest

from helpers.figure_tools import make_tiny


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp('figures'))
