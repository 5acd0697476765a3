"""Modules built to be loaded (cocos.models.noinit): no random numbers drawn, the loaded module bit for bit."""

from __future__ import annotations

import pytest
import torch

from cocos.models.cnn import build_cnn
from cocos.models.noinit import RANDOM_INITS, weights_to_be_loaded
from cocos.models.registry import get_family


def _vsepp():
    return get_family("vsepp").build(vocab_size=30, word_dim=8, embed_size=6, img_dim=10, num_layers=1)


@pytest.mark.parametrize("build, draws", [(lambda: build_cnn("resnet18"), False), (_vsepp, True)],
                         ids=["resnet18", "vsepp"])
def test_built_without_drawing_then_loaded_is_the_module_built_and_loaded(build, draws):
    torch.manual_seed(0)
    reference = build().eval()
    state = reference.state_dict()
    rng = torch.random.get_rng_state()
    with weights_to_be_loaded():
        fresh = build()
    # a ResNet draws only through torch.nn.init; VSE++ also draws with tensor methods (weight.data.uniform_)
    assert torch.equal(torch.random.get_rng_state(), rng) != draws
    fresh.load_state_dict(state)  # strict: every tensor
    fresh.eval()
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in state.items())
    torch.manual_seed(0)
    slow = build()  # the slow way: drawn, then loaded
    slow.load_state_dict(state)
    slow.eval()
    assert all(torch.equal(slow.state_dict()[k], fresh.state_dict()[k]) for k in state)


def test_the_initialisers_come_back_even_after_an_error():
    before = {name: getattr(torch.nn.init, name) for name in RANDOM_INITS}
    with pytest.raises(ValueError), weights_to_be_loaded():
        assert torch.nn.init.normal_ is not before["normal_"]
        raise ValueError
    assert {name: getattr(torch.nn.init, name) for name in RANDOM_INITS} == before
    x = torch.zeros(1000)
    torch.nn.init.normal_(x)
    assert x.std() > 0.5  # drawing again
