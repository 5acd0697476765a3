"""The training loop's extension points (cocos.training.hooks): called where the module docstring says."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from cocos.data.synth import make_synthetic
from cocos.training.hooks import Hook
from cocos.training.trainer import TrainConfig, Trainer

QUIET = {"progress": False, "log": lambda *a: None}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_synthetic(tmp_path_factory.mktemp("syn") / "d", n_train=96, n_dev=32, n_test=32, feature_dim=16,
                          seed=2)


class Recorder(Hook):
    """Keeps what the loop hands it; adds weight x the captions' mean first coordinate to the loss."""

    def __init__(self, weight: float) -> None:
        self.weight, self.seen, self.after = weight, [], 0

    def observe(self, batch, images, captions):
        self.seen.append((batch.step, batch.epoch, batch.full, images.detach().clone(), captions.detach().clone()))

    def extra_loss(self, batch, images, captions):
        term = self.weight * captions[:, 0].mean()
        return term, {"extra": float(term.detach())}

    def after_step(self):
        self.after += 1


def _trainer(data, out, **kw):
    cfg = TrainConfig.of(data=str(data), out=str(out), loss="triplet", epochs=1, lr=1e-3, lr_update=5, batch_size=50,
                      embed_size=8, word_dim=8, seed=0, device="cpu", **kw)
    return Trainer(cfg, **QUIET)


def test_a_hook_sees_each_steps_embeddings_and_its_term_enters_loss_and_log(tiny, tmp_path):
    trainer = _trainer(tiny, tmp_path / "a")
    hook = Recorder(0.5)
    trainer.hooks.append(hook)
    batches = list(trainer.batches(1))
    model_before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    img, cap, ci = batches[0]
    trainer.model.train()
    value = trainer.step(img, cap, ci, epoch=1)
    step, epoch, full, images, captions = hook.seen[0]
    assert (step, epoch, full, hook.after) == (1, 1, True, 1)
    trainer.model.load_state_dict(model_before)  # the same forward pass, recomputed independently
    feats = trainer.train_split.features_for(img)
    from cocos.data.text import pad_batch

    tokens, lengths = pad_batch([trainer.train_ids[c] for c in cap])
    with torch.no_grad():
        ref_img, ref_cap = trainer.model(feats, tokens, lengths)
        ref_loss = trainer.loss_fn(ref_img, ref_cap, caption_image=ci, image_ids=torch.as_tensor(img))
    assert torch.allclose(images, ref_img, atol=1e-6) and torch.allclose(captions, ref_cap, atol=1e-6)
    row = trainer.step_log[0]
    assert row["extra"] == pytest.approx(0.5 * float(ref_cap[:, 0].mean()), abs=1e-6)
    assert value == pytest.approx(float(ref_loss) + row["extra"], abs=1e-5) and row["L_con"] == pytest.approx(
        float(ref_loss), abs=1e-5)


def test_the_short_final_batch_is_not_full_and_every_step_is_seen(tiny, tmp_path):
    trainer = _trainer(tiny, tmp_path / "b")
    hook = Recorder(0.0)
    trainer.hooks.append(hook)
    trainer.fit()
    n = len(list(trainer.batches(1)))
    assert [s[0] for s in hook.seen] == list(range(1, n + 1)) and hook.after == n
    assert [s[2] for s in hook.seen] == [True] * (n - 1) + [False]  # 480 captions: 9 batches of 50, then 30
    log = pd.read_csv(tmp_path / "b" / "train_log.csv")
    assert list(log["step"]) == list(range(1, n + 1)) and "extra" in log.columns
