"""One module per loss family: its maths (one direction of the training loss, on a
:class:`~cocos.data.layout.QueryView`) and its closed-form counter, over the shared core
:mod:`cocos.losses.functional` (the maths every loss and its counter share) and
:mod:`cocos.losses.counts` (what a count is, companions, aggregation).

``triplet`` (Triplet, Triplet SH), ``ntxent``, ``smoothap``, ``goal`` (GOAL's weights and designed
gradients), ``generic`` (the autograd counter for any loss), ``ltd`` (latent target decoding, a
training extension). The families' specs and the registry that builds the training losses
(:func:`cocos.objectives.get_loss`) sit one layer above, in :mod:`cocos.objectives`.
"""
