"""The settings of latent target decoding (``cocos train --ltd``), torch-free so that the command's flags take their
defaults from here (:mod:`cocos.losses.ltd` holds the maths; LTD paper, definitions file "LTD")."""

from __future__ import annotations

from dataclasses import dataclass

from cocos.errors import CocosError

MODES = ("constraint", "dual")
ETA = 0.2  # the constraint's bound on the reconstruction loss (the LTD paper's η)
BETA = 1.0  # the dual loss's weight (β)


@dataclass(frozen=True)
class LTDConfig:
    """What ``cocos train --ltd`` adds: the mode, its bound ``η`` or weight ``β``, and where the targets come from."""

    mode: str = "constraint"
    eta: float = ETA
    beta: float = BETA
    targets: str | None = None  # a user's .npy (one row per training caption); None = all-MiniLM-L6-v2

    def validate(self) -> None:
        if self.mode not in MODES:
            raise CocosError(f"unknown --ltd-mode '{self.mode}' (choose from {', '.join(MODES)})")
        if not 0 < self.eta < float("inf"):  # NaN fails too
            raise CocosError(f"--ltd-eta must be a positive number, got {self.eta}")
        if not self.beta >= 0 or self.beta == float("inf"):
            raise CocosError(f"--ltd-beta must be a non-negative number, got {self.beta}")
