"""One module per loss family: its maths (one direction of the training loss, on a
:class:`~cocos.data.layout.QueryView`), its closed-form counter and its spec (an
:class:`~cocos.losses.spec.Objective`: label, statistics, paper table, colour, notes), over the shared core
:mod:`cocos.losses.functional` (the maths every loss and its counter share),
:mod:`cocos.losses.counts` (what a count is, companions, aggregation), :mod:`cocos.losses.reducers` (a
family's terms reduced to a loss or a count: the closed-form counter of hinge-like terms),
:mod:`cocos.losses.kernels` (faster computations of the same bits, apart from the maths) and
:mod:`cocos.losses.spec`.

``triplet`` (Triplet, Triplet SH), ``ntxent``, ``smoothap``, ``goal`` (GOAL's weights, designed
gradients and counter), ``imc`` (Triplet SH with intra-modal constraints), ``generic`` (the autograd
counter for any loss), ``ltd`` (latent target decoding, a training extension). The registry that
builds the training losses (:func:`cocos.objectives.get_loss`) sits one layer above, in
:mod:`cocos.objectives`.
"""
