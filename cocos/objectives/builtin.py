"""The four loss families of the COCOS paper, in its order (Tables 2, 3 and 4).

Each is one :class:`~cocos.objectives.spec.Objective`: the direction maths come
from :mod:`cocos.losses.functional` and the counters from :mod:`cocos.counting`,
which share them; the rest is what the paper says about the family.
"""

from __future__ import annotations

from functools import partial

from cocos.defaults import DEFAULT_MARGIN, DEFAULT_TAU_NTXENT
from cocos.losses.functional import ntxent_direction, smoothap_direction, triplet_direction
from cocos.losses.ntxent import NTXentCounter
from cocos.losses.smoothap import SmoothAPCounter
from cocos.losses.triplet import TripletCounter, TripletSHCounter
from cocos.objectives import register
from cocos.objectives.spec import Note, Objective

TRIPLET_COMPAT = Note(
    "Triplet t2i in compat mode groups the violations by negative image, as the published counter "
    "does (C^B is unchanged; C^q and C^0 are over images).",
    r"Triplet t2i in compat mode groups the violations by negative image, as the published counter "
    r"does ($C^{\mathcal{B}}$ is unchanged; $C^{q}$ and $C^{0}$ are over images).",
    when="compat",
)

SMOOTHAP_ARTEFACT = Note(
    "SmoothAP t2i in compat mode reproduces the published counter: for caption query q it takes the "
    "rows k·q … k·q+k−1 of the image-by-image matrix (those < B) instead of the row of the caption's "
    "own image, so for q ≥ B/k the slice is empty and nearly every caption query counts as "
    "zero-gradient (the paper's Table 4 shows C^0 ≈ 637 of 640). The corrected counter uses the "
    "caption's own image. In compat mode a batch where no query has a weight above ε counts as "
    "C^q = 0, as published; the corrected mean leaves it out.",
    r"SmoothAP t2i in compat mode reproduces the published counter: for caption query $q$ it takes "
    r"the rows $kq \ldots kq+k-1$ of the image-by-image matrix (those $< B$) instead of the row of the "
    r"caption's own image, so for $q \geq B/k$ the slice is empty and nearly every caption query "
    r"counts as zero-gradient (the paper's Table 4 shows $C^{0} \approx 637$ of 640). The corrected "
    r"counter uses the caption's own image. In compat mode a batch where no query has a weight above "
    r"$\varepsilon$ counts as $C^{q} = 0$, as published; the corrected mean leaves it out.",
    when="compat",
)

NTXENT_WEIGHTS = Note(
    "Weights exclude the 1/τ factor of the gradient; W_low is the weight of the negatives under ε "
    "(beyond the paper).",
    r"Weights exclude the $1/\tau$ factor of the gradient; $W_{\mathrm{low}}$ is the weight of the "
    r"negatives under $\varepsilon$ (beyond the paper).",
)

TRIPLET = register(Objective(
    name="triplet", label="Triplet loss", layout="pair",
    direction_loss=partial(triplet_direction, hardest=False), defaults={"margin": DEFAULT_MARGIN}, combine="sum",
    counter=TripletCounter, stats=("C_q", "C_B", "C_0"), main_stat="C_q", table="2", color="#1f77b4", marker="o",
    notes=(TRIPLET_COMPAT,), description="hinge over all negatives (paper Eq. 3)",
))
TRIPLET_SH = register(Objective(
    name="triplet_sh", label="Triplet loss SH", layout="pair",
    direction_loss=partial(triplet_direction, hardest=True), defaults={"margin": DEFAULT_MARGIN}, combine="sum",
    counter=TripletSHCounter, stats=("C_q", "C_B", "C_0"), main_stat="C_q", table="2", color="#ff7f0e", marker="s",
    description="hinge on the hardest negative only (VSE++ max violation)", warmup_loss="triplet",
))
NTXENT = register(Objective(
    name="ntxent", label="NT-Xent", layout="pair",
    direction_loss=ntxent_direction, defaults={"tau": DEFAULT_TAU_NTXENT}, combine="mean",
    counter=NTXentCounter, stats=("C_qv-", "W_qv-", "W_qv+", "W_low"), main_stat="C_qv-", table="3",
    color="#2ca02c", marker="^", notes=(NTXENT_WEIGHTS,), description="softmax cross-entropy at temperature tau",
))
SMOOTHAP = register(Objective(
    name="smoothap", label="SmoothAP", layout="ranking",
    direction_loss=smoothap_direction, defaults={"tau": 0.01}, combine="mean",
    counter=SmoothAPCounter, stats=("C_q", "C_0"), main_stat="C_q", table="4", color="#d62728", marker="D",
    notes=(SMOOTHAP_ARTEFACT,), description="1 - smoothed average precision (ranking batches)",
))


from cocos.objectives.goal import GOAL  # noqa: E402  (GOAL: designed gradients, a family of its own)

register(GOAL)

from cocos.objectives.imc import IMC  # noqa: E402  (IMC: Triplet SH with intra-modal constraints)

register(IMC)
