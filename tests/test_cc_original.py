"""VSRN's image encoder mapped onto cocos's names (:func:`cocos.models.original.map_vsrn_image`): the mapping and
each refusal, on hand-built state dicts (#29 split the function into named helpers)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cocos.errors import CocosError
from cocos.models.original import map_vsrn_image

E, D = 4, 6
PATH = Path("vsrn.pth.tar")


def _vsrn(n_gcn: int = 2, final_bn: bool = True, gru_layers: int = 1) -> dict:
    sd = {"fc.weight": torch.ones(E, D), "fc.bias": torch.zeros(E)}
    for i in range(1, n_gcn + 1):
        for name in ("g", "theta", "phi", "W.0"):
            sd[f"Rs_GCN_{i}.{name}.weight"] = torch.full((E, E, 1), float(i))  # Conv1d, kernel size 1
            sd[f"Rs_GCN_{i}.{name}.bias"] = torch.zeros(E)
        for name in ("weight", "bias", "running_mean", "running_var"):
            sd[f"Rs_GCN_{i}.W.1.{name}"] = torch.zeros(E)
    for layer in range(gru_layers):
        sd[f"img_rnn.weight_ih_l{layer}"] = torch.zeros(3 * E, E)
        sd[f"img_rnn.weight_hh_l{layer}"] = torch.zeros(3 * E, E)
        sd[f"img_rnn.bias_ih_l{layer}"] = torch.zeros(3 * E)
        sd[f"img_rnn.bias_hh_l{layer}"] = torch.zeros(3 * E)
    if final_bn:
        for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            sd[f"bn.{name}"] = torch.zeros(E)
    return sd


def test_mapping_renames_blocks_and_adds_the_batch_counter():
    state, hparams = map_vsrn_image(_vsrn(), PATH, {"data_name": "coco_precomp"})
    assert hparams == {"img_dim": D, "embed_size": E, "n_gcn": 2, "final_bn": True, "norm_over_regions": True}
    assert state["gcn.1.theta.weight"].shape == (E, E) and float(state["gcn.1.theta.weight"][0, 0]) == 2.0
    assert int(state["gcn.0.bn.num_batches_tracked"]) == 0  # torch < 0.4.1 lacks it: a zero counter
    # 2 (fc) + per block 8 (g/theta/phi/W) + 5 (bn) + 4 (GRU) + 5 (final bn)
    assert len(state) == 2 + 2 * (8 + 5) + 4 + 5
    assert not any(k.startswith("Rs_GCN_") for k in state)


def test_f30k_with_the_final_batchnorm_skips_the_fc_norm():
    assert map_vsrn_image(_vsrn(), PATH, {"data_name": "f30k_precomp"})[1]["fc_norm"] is False
    assert "fc_norm" not in map_vsrn_image(_vsrn(final_bn=False), PATH, {"data_name": "f30k_precomp"})[1]


def _refusal(sd: dict) -> str:
    with pytest.raises(CocosError) as info:
        map_vsrn_image(sd, PATH, {})
    return str(info.value)


def test_refusals():
    assert _refusal({k: v for k, v in _vsrn(3).items() if not k.startswith("Rs_GCN_2.")}) == (
        "vsrn.pth.tar: the image encoder's graph-reasoning blocks are numbered [1, 3], expected Rs_GCN_1..n")
    no_bn = {**_vsrn(1), "Rs_GCN_1.W.weight": torch.zeros(E, E, 1)}
    assert _refusal(no_bn) == ("vsrn.pth.tar: Rs_GCN_1.W has no BatchNorm (bn_layer=False); cocos's RsGCN keeps "
                               "VSRN's BatchNorm")
    assert _refusal(_vsrn(gru_layers=2)) == "vsrn.pth.tar: the image GRU has 2 layers; VSRN's has one"
    assert _refusal({**_vsrn(), "attn.weight": torch.zeros(1), "bn2.bias": torch.zeros(1)}) == (
        "vsrn.pth.tar: the image encoder holds unexpected weights (attn.weight, bn2.bias); cocos imports VSRN's "
        "EncoderImagePrecompAttn")
    # "bn2." is not the final BatchNorm's "bn." prefix; without a final BatchNorm no "bn.*" key is left unused
    assert _refusal({**_vsrn(final_bn=False), "bn2.bias": torch.zeros(1)}).endswith(
        "unexpected weights (bn2.bias); cocos imports VSRN's EncoderImagePrecompAttn")


def test_a_gru_without_its_first_input_weights_is_one_line():
    """Layer 1 present but not layer 0's input weights: refused by name (was a KeyError)."""
    sd = {k: v for k, v in _vsrn(gru_layers=2).items() if k != "img_rnn.weight_ih_l0"}
    assert _refusal(sd) == "vsrn.pth.tar: the image encoder lacks its GRU (img_rnn.weight_ih_l0)"
