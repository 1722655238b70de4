"""vit_plugin.deploy: torch.compile with Inductor freezing for CPU inference.

One compiled model, shared by the tests below in their order: the first checks the frozen graph, the
second writes the model's weights and switches its mode, and recompiles as the error message says."""
import pytest
import torch
from torch.profiler import profile

from vit_plugin.deploy import compile_for_inference
from vit_plugin.models.backbones import ViT

PACKED_GEMMS = {'mkl::_mkl_linear', 'mkldnn::_linear_pointwise'}  # Inductor's pre-packed dense layers


@pytest.fixture(scope='module')
def compiled():
    """(a one-block ViT, its frozen compiled form after one call, the non-square input it compiled for)."""
    torch.compiler.reset()
    torch.manual_seed(0)
    model = ViT(arch=dict(embed_dims=64, num_layers=1, num_heads=2, mlp_dims=128), img_size=32, patch_size=8,
                out_type='cls_token')
    model.init_weights()
    x = torch.randn(2, 3, 32, 48)  # non-square: the position embedding is resized inside the graph
    fast = compile_for_inference(model, fullgraph=True)
    fast(x)
    yield model, fast, x
    torch.compiler.reset()


def test_frozen_graph_matches_eager_and_uses_prepacked_gemms(compiled):
    model, fast, x = compiled
    out, = fast(x)
    with torch.no_grad():
        ref, = model(x)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    assert not out.requires_grad
    assert list(fast.state_dict()) == ['model.' + k for k in model.state_dict()]  # no duplicate copies
    with profile() as prof:
        fast(x)
    ops = {event.key for event in prof.key_averages()}
    # The point of freezing: dense layers run on weights packed once at compile time. (Passing
    # options={'freezing': True} to torch.compile compiles plain addmm's instead.)
    assert ops & PACKED_GEMMS, sorted(ops)
    assert not any('addmm' in op for op in ops), sorted(ops)


def test_changed_weights_or_train_mode_are_refused(compiled):
    model, fast, x = compiled
    fast(x)
    model.train()
    with pytest.raises(RuntimeError, match='eval-mode graphs only'):
        fast(x)
    model.eval()
    fast(x)  # unchanged weights: fine again
    state = model.state_dict()
    state['blocks.0.mlp.fc2.weight'] = state['blocks.0.mlp.fc2.weight'] * 2
    model.load_state_dict(state)  # a frozen graph would silently keep the old weights
    with pytest.raises(RuntimeError, match=r'weight\(s\) were written after compilation .*torch.compiler.reset'):
        fast(x)
    torch.compiler.reset()
    fresh, = compile_for_inference(model)(x)  # what the message says to do
    with torch.no_grad():
        torch.testing.assert_close(fresh, model(x)[0], rtol=0, atol=1e-5)
