"""cocos: COCOS gradient diagnostics for contrastive image-caption retrieval.

Counting contributing samples (Bleeker & de Rijke, ECIR 2022): for a frozen
retrieval model, count per loss how many candidates still contribute to the
gradient with respect to each query. Exact definitions live in
``docs/definitions.md`` ("the definitions file"); the library follows the data:
``data -> models -> losses -> training -> embed -> counting -> results -> report -> pipelines``.
"""

__version__ = "0.1.0"

from cocos.errors import CocosError  # noqa: E402

__all__ = ["CocosError", "__version__"]
