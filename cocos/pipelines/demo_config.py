"""``cocos demo``'s settings, each default written once (torch-free: the command's flags take theirs from here).

The demo's schedule is shorter than the paper's (``cocos train``'s, :mod:`cocos.training.config`): 8 epochs at
lr 1e-3 dropped after 6, a smaller model (embeddings 256, words 128), on a synthetic world of 3,000 scenes.
``--images`` renders the image world, pre-trains a ResNet-18 on its attribute task
(:mod:`cocos.training.pretrain`, :data:`PRETRAIN_EPOCHS` epochs) and trains VSE++ on the frozen CNN's features
(:data:`IMAGE_DEFAULTS`); ``--images --finetune`` fine-tunes that CNN inside VSE++ instead
(:data:`FINETUNE_DEFAULTS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cocos.defaults import DEFAULT_BATCH_SIZE


def _paper_losses() -> list[str]:
    """The registered families of the COCOS paper's tables (the registry is imported when a config is made)."""
    from cocos.objectives import paper_names

    return paper_names()


PRETRAIN_EPOCHS = 10  # cocos demo --images: epochs of the attribute pre-training


@dataclass
class DemoConfig:
    out: str = "reports/demo"
    data: str = "data/synth"
    checkpoints: str = "checkpoints/demo"
    losses: list[str] = field(default_factory=lambda: _paper_losses())
    model: str = "vsepp"  # a BERT family (vse_infty) trains beside VSE++ (cocos.pipelines.demo.demo_runs)
    bert: str | None = None  # its BERT folder (None: the bundled all-MiniLM-L6-v2)
    epochs: int = 8
    lr: float = 1e-3
    lr_update: int = 6
    warmup_epochs: int = 1
    batch_size: int = DEFAULT_BATCH_SIZE
    embed_size: int = 256
    word_dim: int = 128
    n_train: int = 3000
    n_dev: int = 500
    n_test: int = 500
    seed: int = 0
    device: str = "auto"
    retrain: bool = False
    overwrite: bool = False  # replace an --out or --data folder that cocos did not write
    track_cocos: int | None = 10  # count COCOS on the training batches every N steps (None: off)
    # raw images (cocos demo --images): the rendered world, a CNN pre-trained on its attribute task, then frozen
    # (VSE++ on its features) or, with finetune, fine-tuned inside VSE++
    images: bool = False
    finetune: bool = False
    pretrain_epochs: int = PRETRAIN_EPOCHS
    cnn: str = "resnet18"
    image_size: int = 64  # side of the rendered JPEGs
    crop_size: int = 32  # pre-training and features: Resize(crop * 256/224) + CenterCrop(crop); fine-tuning:
    # RandomResizedCrop(crop) for training, the same Resize + CenterCrop for evaluation
    workers: int = 0  # DataLoader workers decoding images (does not change the result)


# cocos demo --images: where its folders go and its schedule, where it differs from the feature demo's
IMAGE_DEFAULTS = {"out": "reports/demo_images", "data": "data/synth_images", "checkpoints": "checkpoints/demo_images",
                  "n_train": 3000, "n_dev": 200, "n_test": 200, "epochs": 6, "lr_update": 2, "warmup_epochs": 2}
# cocos demo --images --finetune: its own report; the world, the pre-trained CNN and the checkpoints folder are
# the frozen demo's (its models in CHECKPOINTS/finetune/); a shorter schedule (a step trains the CNN)
FINETUNE_DEFAULTS = {**IMAGE_DEFAULTS, "out": "reports/demo_images_finetune", "epochs": 3, "lr_update": 2,
                     "warmup_epochs": 1}
FINETUNE_CNN_LR = 0.1  # the pre-trained CNN fine-tunes at a tenth of the rate (the new layers at the full one)

# cocos demo --model vse_infty: its own report folder (the VSE++ models and the data are the plain demo's, reused)
BERT_DEFAULTS = {"out": "reports/demo_vse_infty"}
