import pytest
import torch

from cocos.errors import CocosError
from cocos.models import MODELS, VSEPP, VSRN, CaptionEncoder, RsGCN, build_model, l2norm

IMG_DIM, VOCAB, WORD_DIM, EMBED = 16, 40, 8, 12
HPARAMS = {"img_dim": IMG_DIM, "vocab_size": VOCAB, "word_dim": WORD_DIM, "embed_size": EMBED}


def make_model(kind, seed=0):
    torch.manual_seed(seed)
    return build_model(kind, **HPARAMS)


def make_captions(lengths, max_len=None, seed=1):
    """Random token ids (1..VOCAB-1) with zero padding after each length."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    max_len = max_len or int(lengths.max())
    tokens = torch.randint(1, VOCAB, (len(lengths), max_len), generator=g)
    tokens[torch.arange(max_len)[None, :] >= lengths[:, None]] = 0
    return tokens, lengths


def regions(n, r=5, seed=2):
    return torch.randn(n, r, IMG_DIM, generator=torch.Generator().manual_seed(seed))


def test_l2norm_unit_rows_and_zero_safe():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    out = l2norm(x)
    assert torch.allclose(out[0], torch.tensor([0.6, 0.8]))
    assert torch.equal(out[1], torch.zeros(2))  # eps avoids 0/0


@pytest.mark.parametrize("kind", ["vsepp", "vsrn"])
@pytest.mark.parametrize("features", [regions(4), regions(4)[:, 0]], ids=["regions", "global"])
def test_shapes_and_unit_norms(kind, features):
    model = make_model(kind).eval()
    tokens, lengths = make_captions([3, 7, 1, 5, 2, 6])
    with torch.no_grad():
        img, cap = model(features, tokens, lengths)
    assert img.shape == (4, EMBED) and cap.shape == (6, EMBED)
    assert torch.allclose(img.norm(dim=1), torch.ones(4), atol=1e-5)
    assert torch.allclose(cap.norm(dim=1), torch.ones(6), atol=1e-5)


def test_vsepp_mean_pools_regions():
    model = make_model("vsepp").eval()
    feats = regions(3)
    with torch.no_grad():
        assert torch.allclose(model.encode_images(feats), model.encode_images(feats.mean(1)))


@pytest.mark.parametrize("kind", ["vsepp", "vsrn"])
def test_eval_mode_is_deterministic_and_batch_independent(kind):
    model = make_model(kind)
    feats = regions(4)
    tokens, lengths = make_captions([4, 2, 6, 3])
    with torch.no_grad():
        model.train()
        model(feats, tokens, lengths)  # move the BatchNorm running statistics off their init
        model.eval()
        img1, cap1 = model(feats, tokens, lengths)
        img2, cap2 = model(feats, tokens, lengths)
        single = model.encode_images(feats[2:3])
    assert torch.equal(img1, img2) and torch.equal(cap1, cap2)
    assert torch.allclose(single[0], img1[2], atol=1e-6)


def test_caption_padding_invariance():
    torch.manual_seed(0)
    enc = CaptionEncoder(VOCAB, WORD_DIM, EMBED).eval()
    tokens, lengths = make_captions([4])
    with torch.no_grad():
        alone = enc(tokens, lengths)[0]
        # padded to a longer length
        padded = torch.cat([tokens, torch.zeros(1, 6, dtype=torch.long)], dim=1)
        assert torch.allclose(enc(padded, lengths)[0], alone, atol=1e-6)
        # next to a longer caption (which forces padding of the short one)
        other, _ = make_captions([9], seed=5)
        batch = torch.zeros(2, 9, dtype=torch.long)
        batch[0, :4], batch[1] = tokens[0], other[0]
        out = enc(batch, torch.tensor([4, 9]))
    assert torch.allclose(out[0], alone, atol=1e-6)
    assert not torch.allclose(out[1], alone, atol=1e-3)


def test_caption_state_ignores_tokens_after_length():
    torch.manual_seed(0)
    enc = CaptionEncoder(VOCAB, WORD_DIM, EMBED).eval()
    tokens, lengths = make_captions([3, 3], max_len=6)
    tokens[1, :3] = tokens[0, :3]
    tokens[1, 3:] = 7  # garbage beyond the length must not matter
    with torch.no_grad():
        out = enc(tokens, lengths)
    assert torch.allclose(out[0], out[1], atol=1e-6)


@pytest.mark.parametrize("kind", ["vsepp", "vsrn"])
def test_unsorted_lengths_permute_with_batch(kind):
    model = make_model(kind).eval()
    tokens, lengths = make_captions([2, 8, 5, 1, 6, 3])
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    with torch.no_grad():
        cap = model.encode_captions(tokens, lengths)
        cap_perm = model.encode_captions(tokens[perm], lengths[perm])
    assert torch.allclose(cap_perm, cap[perm], atol=1e-6)
    assert not torch.allclose(cap_perm, cap, atol=1e-3)


def test_bad_lengths_raise():
    enc = CaptionEncoder(VOCAB, WORD_DIM, EMBED)
    tokens, _ = make_captions([3, 3])
    with pytest.raises(CocosError, match="lengths"):
        enc(tokens, torch.tensor([0, 3]))
    with pytest.raises(CocosError, match="lengths"):
        enc(tokens, torch.tensor([3, 4]))


def test_bad_image_shape_raises():
    with pytest.raises(CocosError, match="image features"):
        make_model("vsepp").encode_images(torch.randn(2, IMG_DIM + 1))
    with pytest.raises(CocosError, match="image features"):
        make_model("vsrn").encode_images(torch.randn(2, 3, 4, IMG_DIM))


@pytest.mark.parametrize("train", [True, False])
def test_rs_gcn_is_identity_at_init(train):
    torch.manual_seed(0)
    layer = RsGCN(EMBED).train(train)
    x = torch.randn(3, 5, EMBED)
    with torch.no_grad():
        assert torch.equal(layer(x), x)
        layer.bn.weight.fill_(1.0)  # once the BatchNorm is switched on the layer is not
        assert not torch.allclose(layer(x), x, atol=1e-3)


def test_vsrn_has_n_gcn_layers_all_identity():
    model = make_model("vsrn")
    assert len(model.gcn) == 4
    x = torch.randn(2, 5, EMBED)
    with torch.no_grad():
        for layer in model.gcn:
            assert torch.equal(layer(x), x)


def test_unknown_kind():
    with pytest.raises(CocosError, match=r"^unknown model 'x' \(choose from vsepp, vsrn, vsepp_full, vse_infty, vse_infty_full, clip, siglip\)$"):
        build_model("x", **HPARAMS)


@pytest.mark.parametrize("kind", ["vsepp", "vsrn"])
def test_kind_and_hparams_rebuild_the_model(kind):
    model = make_model(kind)
    assert MODELS[kind] is type(model) and model.kind == kind
    assert all(isinstance(v, (int, float, bool, str)) for v in model.hparams.values())
    rebuilt = build_model(model.kind, **model.hparams)
    rebuilt.load_state_dict(model.state_dict())  # strict: same parameter names and shapes
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {
        k: v.shape for k, v in model.state_dict().items()}


def test_model_classes():
    assert VSEPP.kind == "vsepp" and VSRN.kind == "vsrn"


@pytest.mark.parametrize("kind", ["vsepp", "vsrn"])
def test_gradient_reaches_every_parameter(kind):
    model = make_model(kind).train()
    if kind == "vsrn":
        with torch.no_grad():  # zero-initialised BN blocks the gradient into the GCN at init
            for layer in model.gcn:
                layer.bn.weight.fill_(0.5)
    tokens, lengths = make_captions([3, 6, 2, 5])
    img, cap = model(regions(4), tokens, lengths)
    sims = img @ cap.t()
    loss = (0.2 + sims - sims.diag()[:, None]).clamp(min=0).sum()  # triplet-like
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert torch.equal(model.txt_enc.embed.weight.grad[0], torch.zeros(WORD_DIM))  # padding row
