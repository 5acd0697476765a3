"""The built-in loss families, registered in the COCOS paper's order (Tables 2, 3 and 4), then GOAL, IMC and SigLIP.

Each family is one module of :mod:`cocos.losses` holding its maths, its counter and its
:class:`~cocos.losses.spec.Objective` (label, statistics, table, colour, notes); this module only registers them.
"""

from __future__ import annotations

from cocos.losses.goal import GOAL
from cocos.losses.imc import IMC
from cocos.losses.ntxent import NTXENT
from cocos.losses.siglip import SIGLIP
from cocos.losses.smoothap import SMOOTHAP
from cocos.losses.triplet import TRIPLET, TRIPLET_SH
from cocos.objectives import register

for _family in (TRIPLET, TRIPLET_SH, NTXENT, SMOOTHAP, GOAL, IMC, SIGLIP):
    register(_family)
