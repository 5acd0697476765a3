"""cocos's VSE∞ against woodfrog/vse_infty's forward pass (restated in ``tests/reference_vse_infty.py``).

The same state dict (every tensor perturbed at random, BatchNorm running statistics included, so an unused or
misplaced parameter shows) is loaded into cocos's encoders and the reference's; the key sets must be identical, and
the embeddings and GPO's pooling weights equal to 1e-5 on variable region counts and caption lengths, in eval mode
and, for the image encoder's MLP BatchNorm, in training mode. The reference itself is checked against hand-computed
values first, so that the oracle can fail too.
"""

from __future__ import annotations

import math
import random
from contextlib import contextmanager

import pytest
import torch

from cocos.models.vse_infty import GPO, EncoderImageAggr, VSEInfty, VSEInftyFull
from tests import reference_vse_infty as ref

VOCAB = 30
IMG_DIM = 24
EMBED = 16
BERT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
TOL = dict(atol=1e-5, rtol=0)


def _perturbed(state: dict, gen: torch.Generator) -> dict:
    """Every float tensor replaced by random values of its shape (variances kept positive)."""
    out = {}
    for k, v in state.items():
        if not v.is_floating_point():
            out[k] = v.clone()
        elif k.endswith("running_var"):
            out[k] = torch.rand(v.shape, generator=gen) + 0.5
        else:
            out[k] = torch.randn(v.shape, generator=gen) * 0.3
    return out


def _load_same(ours: torch.nn.Module, theirs: torch.nn.Module, seed: int) -> None:
    """Assert both modules have the same state dict keys (and shapes); load the same random state into both."""
    ours_keys = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    theirs_keys = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert sorted(set(ours_keys) - set(theirs_keys)) == [] and sorted(set(theirs_keys) - set(ours_keys)) == []
    assert ours_keys == theirs_keys
    state = _perturbed(theirs.state_dict(), torch.Generator().manual_seed(seed + 100))
    theirs.load_state_dict(state, strict=True)
    ours.load_state_dict(state, strict=True)
    ours.eval()
    theirs.eval()


def _pair(encoder: str, seed: int = 0):
    """(cocos VSEInfty, its encoder, the reference encoder), the same random state loaded into both encoders."""
    torch.manual_seed(seed)
    model = VSEInfty(VOCAB, IMG_DIM, dict(BERT), embed_size=EMBED)
    ours = getattr(model, encoder)
    theirs = ref.EncoderImageAggr(IMG_DIM, EMBED, "basic") if encoder == "img_enc" else ref.EncoderText(dict(BERT), EMBED)
    _load_same(ours, theirs, seed)
    return model.eval(), ours, theirs


def _regions(lengths: list[int], dim: int = IMG_DIM, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return ref.collate_regions([torch.randn(n, dim, generator=gen) for n in lengths])


def _captions(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    caps = [[2] + torch.randint(5, VOCAB, (n - 2,), generator=gen).tolist() + [3] for n in lengths]
    return ref.collate_captions(caps)


@contextmanager
def _capture_weights(module):
    """A forward hook on ``module.gpool`` keeping GPO's pooling weights (its second output) of the last call."""
    seen = {}
    handle = module.gpool.register_forward_hook(lambda m, args, out: seen.__setitem__("w", out[1].detach().clone()))
    try:
        yield seen
    finally:
        handle.remove()


# -- the oracle itself, by hand ---------------------------------------------------------------------------------

def test_reference_positional_encoding_by_hand():
    pe = ref.positional_encoding_1d(4, 3)
    # columns: sin(p), cos(p), sin(p / 100), cos(p / 100)  (10000 ** (-2/4) = 1/100)
    for p in range(3):
        want = [math.sin(p), math.cos(p), math.sin(p / 100), math.cos(p / 100)]
        assert pe[p].tolist() == pytest.approx(want, abs=1e-6)


def test_reference_gpo_by_hand():
    gpo = ref.GPO(32, 32)
    feats = torch.tensor([[[1.0, 5.0], [3.0, 2.0], [99.0, 99.0]],
                          [[7.0, -1.0], [50.0, 50.0], [50.0, 50.0]]])
    pooled, w = gpo(feats, torch.tensor([2, 1]))
    assert w.shape == (2, 2, 1)
    assert w[1, 0, 0].item() == pytest.approx(1.0) and w[1, 1, 0].item() < 1e-30  # one region: weight 1, pad 0
    assert pooled[1].tolist() == pytest.approx([7.0, -1.0])
    a, b = w[0, 0, 0].item(), w[0, 1, 0].item()
    assert a + b == pytest.approx(1.0)
    # each dimension sorted descending over the 2 valid regions: (3, 1) and (5, 2); the padded 99 is ignored
    assert pooled[0].tolist() == pytest.approx([3 * a + 1 * b, 5 * a + 2 * b], abs=1e-5)


def test_reference_mlp_batchnorm_over_padded_rows_by_hand():
    torch.manual_seed(0)
    mlp = ref.MLP(IMG_DIM, 8, EMBED, 2).train()
    x, _ = _regions([5, 2])  # 2 x 5 rows, 3 of them padding
    mlp(x)
    h = mlp.layers[0](x.reshape(10, IMG_DIM)).detach()
    assert torch.allclose(mlp.bns[0].running_mean, 0.1 * h.mean(0), atol=1e-6)
    assert torch.allclose(mlp.bns[0].running_var, 0.9 + 0.1 * h.var(0, unbiased=True), atol=1e-6)


class _Scripted:
    """A random.Random stand-in replaying given random() values; choice() takes the last element."""

    def __init__(self, values):
        self.values = list(values)
        self.calls = []

    def random(self):
        self.calls.append("random")
        return self.values.pop(0)

    def choice(self, seq):
        self.calls.append("choice")
        return seq[-1]


def test_reference_process_caption_by_hand():
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "dog", "run", "##s", "zz"])}
    words = [["a"], ["dog"], ["run", "##s"], ["a"], ["run", "##s"], ["dog"]]
    # eval: no change, but one draw per word all the same
    rng = _Scripted([0.0] * 6)
    assert ref.process_caption(words, vocab, False, rng) == [2, 5, 6, 7, 8, 5, 7, 8, 6, 3]
    assert rng.calls == ["random"] * 6
    # train: 0.05 -> mask ; 0.5 -> keep ; 0.11 (0.55) -> random tokens (one choice per sub-token) ;
    # 0.15 (0.75) -> dropped ; 0.19 (0.95) -> dropped ; 0.2 -> keep
    rng = _Scripted([0.05, 0.5, 0.11, 0.15, 0.19, 0.2])
    assert ref.process_caption(words, vocab, True, rng) == [2, 4, 6, 9, 9, 6, 3]
    assert rng.calls == ["random"] * 3 + ["choice"] * 2 + ["random"] * 3
    assert ref.process_caption([["cat"]], vocab, False, random.Random(0)) == [2, 1, 3]  # unknown -> [UNK]


def test_reference_contrastive_loss_by_hand():
    im = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    s = torch.tensor([[0.6, 0.8], [1.0, 0.0]])
    # scores = [[0.6, 1.0], [0.8, 0.0]]; margin 0.2
    # caption retrieval (rows): [0.2 + 1.0 - 0.6]_+ = 0.6, [0.2 + 0.8 - 0.0]_+ = 1.0
    # image retrieval (cols): [0.2 + 0.8 - 0.6]_+ = 0.4, [0.2 + 1.0 - 0.0]_+ = 1.2
    assert ref.contrastive_loss(im, s, 0.2).item() == pytest.approx(3.2)
    s3 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    im3 = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    # scores = [[1, 0, .6], [.6, .8, 1], [0, 1, .8]], diagonal (1, .8, .8); margin .5:
    # rows (caption retrieval): row0 (0, .1), row1 (.3, .7), row2 (0, .7) -> sum 1.8, maxima .1 + .7 + .7 = 1.5
    # cols (image retrieval):   col0 (.1, 0), col1 (0, .7), col2 (.3, .7) -> sum 1.8, maxima .1 + .7 + .7 = 1.5
    assert ref.contrastive_loss(im3, s3, 0.5).item() == pytest.approx(3.6)
    assert ref.contrastive_loss(im3, s3, 0.5, max_violation=True).item() == pytest.approx(3.0)


# -- cocos against the reference --------------------------------------------------------------------------------

def test_state_dict_keys_are_img_enc_and_txt_enc_prefixed():
    torch.manual_seed(0)
    model = VSEInfty(VOCAB, IMG_DIM, dict(BERT), embed_size=EMBED)
    want = {"img_enc." + k for k in ref.EncoderImageAggr(IMG_DIM, EMBED).state_dict()}
    want |= {"txt_enc." + k for k in ref.EncoderText(dict(BERT), EMBED).state_dict()}
    assert set(model.state_dict()) == want


def test_gpo_equals_reference():
    gen = torch.Generator().manual_seed(3)
    theirs = ref.GPO(32, 32)
    theirs.load_state_dict(_perturbed(theirs.state_dict(), gen))
    ours = GPO(32, 32)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    for lengths in ([36, 29, 7, 1], [1], [5, 5, 5], [2, 9, 4, 9, 1, 3]):
        feats = torch.randn(len(lengths), max(lengths) + 2, 16, generator=gen)  # padding beyond the longest too
        le = torch.tensor(lengths)
        p_ours, w_ours = ours(feats, le)
        p_theirs, w_theirs = theirs(feats, le)
        assert w_ours.shape == w_theirs.shape == (len(lengths), max(lengths), 1)
        torch.testing.assert_close(w_ours, w_theirs, **TOL)
        torch.testing.assert_close(p_ours, p_theirs, **TOL)


@pytest.fixture(scope="module")
def img_pair():
    return _pair("img_enc")


@pytest.fixture(scope="module")
def txt_pair():
    return _pair("txt_enc")


@pytest.mark.parametrize("lengths", [[36, 29, 7, 1], [36, 36], [1], [3, 12, 12, 5, 8]])
def test_image_embeddings_equal_reference(img_pair, lengths):
    model, ours, theirs = img_pair
    images, img_lengths = _regions(lengths, seed=len(lengths))
    with _capture_weights(ours) as seen, torch.no_grad():
        want = theirs(images, img_lengths)
        got = ours(images, img_lengths.long())
        via_model = model.encode_images(images, img_lengths.long())
    assert got.shape == (len(lengths), EMBED)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(via_model, want, **TOL)
    torch.testing.assert_close(seen["w"], theirs.pool_weights, **TOL)
    torch.testing.assert_close(want.norm(dim=1), torch.ones(len(lengths)), **TOL)


def test_encode_images_without_lengths_takes_all_regions(img_pair):
    model, _, theirs = img_pair
    images = torch.randn(3, 10, IMG_DIM, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(model.encode_images(images), theirs(images, torch.full((3,), 10.0)), **TOL)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_image_embeddings_equal_reference_random_shapes(img_pair, seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 36) for _ in range(rng.randint(1, 6))]
    model, ours, theirs = img_pair
    images, img_lengths = _regions(lengths, seed=seed + 10)
    with torch.no_grad():
        torch.testing.assert_close(ours(images, img_lengths.long()), theirs(images, img_lengths), **TOL)


def test_image_encoder_training_mode_batchnorm_equals_reference():
    """Training mode: BatchNorm's batch statistics over the same B*N rows (padded ones included) -> same outputs
    and the same running statistics afterwards; the outputs differ from eval mode's (the batch statistics matter)."""
    _, ours, theirs = _pair("img_enc", seed=7)
    images, img_lengths = _regions([36, 29, 7, 1], seed=7)
    with torch.no_grad():
        eval_out = theirs(images, img_lengths)
        ours.train()
        theirs.train()
        got = ours(images, img_lengths.long())
        want = theirs(images, img_lengths)
    torch.testing.assert_close(got, want, **TOL)
    assert (want - eval_out).abs().max() > 1e-3
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(ours.state_dict()[f"mlp.bns.0.{name}"], theirs.state_dict()[f"mlp.bns.0.{name}"],
                                   **(TOL if name != "num_batches_tracked" else {}))


@pytest.mark.parametrize("lengths", [[12, 9, 4, 3], [7], [5, 5], [20, 3, 11]])
def test_caption_embeddings_equal_reference(txt_pair, lengths):
    model, ours, theirs = txt_pair
    tokens, cap_lengths = _captions(lengths, seed=len(lengths))
    assert (tokens[0, lengths[0]:] == 0).all()
    with _capture_weights(ours) as seen, torch.no_grad():
        want = theirs(tokens, torch.Tensor(cap_lengths))
        got = ours(tokens, torch.tensor(cap_lengths))
        via_model = model.encode_captions(tokens, torch.tensor(cap_lengths))
    assert got.shape == (len(lengths), EMBED)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(via_model, want, **TOL)
    torch.testing.assert_close(seen["w"], theirs.pool_weights, **TOL)


def test_caption_embeddings_equal_reference_on_a_batch_run_in_chunks(txt_pair):
    """A batch large enough that cocos runs BERT in chunks of similar lengths (each padded to its own longest):
    the embeddings and their gradients with respect to the linear layer are the reference's, whole-batch ones."""
    model, ours, theirs = txt_pair
    from cocos.models.vse_infty import BERT_CHUNK_ROWS, BERT_CHUNKS

    gen = torch.Generator().manual_seed(5)
    lengths = torch.randint(3, 30, (BERT_CHUNK_ROWS * BERT_CHUNKS + 7,), generator=gen).tolist()
    tokens, cap_lengths = _captions(lengths, seed=6)
    want = theirs(tokens, torch.Tensor(cap_lengths))
    got = ours(tokens, torch.tensor(cap_lengths))
    torch.testing.assert_close(got, want, **TOL)
    (g_want,) = torch.autograd.grad(want.pow(3).sum(), theirs.linear.weight)
    (g_got,) = torch.autograd.grad(got.pow(3).sum(), ours.linear.weight)
    torch.testing.assert_close(g_got, g_want, atol=1e-4, rtol=1e-4)


def test_caption_embedding_ignores_padding(txt_pair):
    """A caption's embedding does not depend on how far the batch pads it (attention mask and GPO's lengths)."""
    model, _, theirs = txt_pair
    tokens, lengths = _captions([6, 14], seed=9)
    with torch.no_grad():
        alone = model.encode_captions(tokens[:1, :6], torch.tensor([6]))
        batched = model.encode_captions(tokens, torch.tensor(lengths))
        torch.testing.assert_close(batched[:1], alone, **TOL)
        torch.testing.assert_close(alone, theirs(tokens[:1, :6], torch.Tensor([6])), **TOL)


@pytest.mark.parametrize("lengths", [[49, 49, 49], [49, 40, 12, 1]])
def test_grid_aggregator_equals_reference_backbone_aggr(lengths):
    """precomp_enc_type "backbone" (grid features, no MLP): the reference's EncoderImageAggr(backbone) on the same
    grid; all 49 cells as in EncoderImageFull's eval, or fewer as its training-time size augmentation pads them."""
    ours, theirs = EncoderImageAggr(IMG_DIM, EMBED, "backbone"), ref.EncoderImageAggr(IMG_DIM, EMBED, "backbone")
    _load_same(ours, theirs, seed=11)
    assert not any(k.startswith("mlp.") for k in ours.state_dict())
    grid, grid_lengths = _regions(lengths, seed=12)
    with _capture_weights(ours) as seen, torch.no_grad():
        want = theirs(grid, grid_lengths)
        torch.testing.assert_close(ours(grid, grid_lengths.long()), want, **TOL)
        torch.testing.assert_close(seen["w"], theirs.pool_weights, **TOL)
    ours.train()
    theirs.train()
    with torch.no_grad():  # no BatchNorm, no dropout: training mode is the same function
        torch.testing.assert_close(ours(grid, grid_lengths.long()), theirs(grid, grid_lengths), **TOL)


def test_grid_model_equals_reference_on_the_backbones_grid():
    """VSEInftyFull (a small ResNet-18 trunk): ``img_enc.image_encoder`` has the reference EncoderImageAggr(backbone)'s
    keys, the model's keys are theirs under ``img_enc.`` (EncoderImageFull: ``backbone.``, ``image_encoder.``) and
    ``txt_enc.``, and ``encode_pooled`` in eval mode (all cells) equals the reference on the same grid."""
    torch.manual_seed(0)
    model = VSEInftyFull(VOCAB, dict(BERT), cnn_type="resnet18", embed_size=EMBED)
    dim = model.img_dim
    theirs = ref.EncoderImageAggr(dim, EMBED, "backbone")
    _load_same(model.img_enc.image_encoder, theirs, seed=13)
    keys = set(model.state_dict())
    assert {k for k in keys if k.startswith("img_enc.image_encoder.")} == {
        "img_enc.image_encoder." + k for k in theirs.state_dict()}
    assert {k for k in keys if k.startswith("txt_enc.")} == {
        "txt_enc." + k for k in ref.EncoderText(dict(BERT), EMBED).state_dict()}
    assert all(k.startswith(("img_enc.backbone.", "img_enc.image_encoder.", "txt_enc.")) for k in keys)
    model.eval()
    grid = torch.randn(3, 49, dim, generator=torch.Generator().manual_seed(14))
    with torch.no_grad():
        torch.testing.assert_close(model.encode_pooled(grid), theirs(grid, torch.full((3,), 49.0)), **TOL)
