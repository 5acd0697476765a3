"""cocos: COCOS gradient diagnostics for contrastive image-caption retrieval.

Counting contributing samples (Bleeker & de Rijke, ECIR 2022): for a frozen
retrieval model, count per loss how many candidates still contribute to the
gradient with respect to each query. Exact definitions live in
``docs/definitions.md`` ("the definitions file").

The library follows the data; each layer imports only the layers before it (never a
later one, checked over the real imports by ``tests/test_layers.py``):

1. base: ``errors``, ``defaults``, ``io``, ``safeload``, ``progress``, ``device``, ``openmp``,
   ``distributed``, ``presentation``, ``plugins`` (the registries' plugin loading), ``typed`` (records checked
   against their annotations), ``results`` (the typed ``results.json``), ``hf`` (which Hugging Face model a
   folder holds, torch-free);
2. ``data``: datasets, batch layouts, samplers;
3. ``models``: the encoders;
4. ``losses``: one module per loss family: its maths, its counter and its spec;
5. ``objectives``: the registry of the families' specs (plugins included);
6. ``counting``: the engine that sweeps a training set;
7. ``training``: the loop, its logs and checkpoints; ``track`` (its public tracker, re-exported);
8. ``legacy``: checkpoints of the original VSE++/VSRN code;
9. ``embed``: frozen encoding of a split;
10. ``report``: tables and figures, from self-describing results only;
11. ``pipelines``: analyze, count, demo, the commands' work.
"""

__version__ = "0.1.0"

from cocos.errors import CocosError  # noqa: E402

__all__ = ["CocosError", "__version__"]
