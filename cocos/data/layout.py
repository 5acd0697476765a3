"""The one definition of positives and negatives in a batch.

A batch holds ``B`` images and ``M`` captions; caption ``c`` belongs to the image
in row ``caption_image[c]``. Two layouts occur (definitions file, "Notation"):

* pair batch (Triplet, Triplet SH, NT-Xent): ``M = B``, caption ``j`` belongs to
  image row ``j``; two rows may hold the same dataset image.
* ranking batch (SmoothAP): ``B`` images with all ``k`` captions, ``M = k B``,
  caption ``c`` belongs to image row ``c // k``.

Positives of a query: i2t, the captions of that image; t2i, its image. Every other
candidate is a negative, except *same-image pairs* (a caption whose image row is a
different row holding the same dataset image): the published code treats them as
negatives (``compat=True``); cocos excludes them otherwise.

Both the training losses (``cocos.losses``) and the counters (``cocos.counting``)
get their masks from here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cocos.errors import CocosError

DIRECTIONS = ("i2t", "t2i")


def positive_index(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of each query's positives in a ``(..., Q, K)`` mask, padded: ``(idx, valid)``, both ``(..., Q, A)``.

    ``A`` is the largest number of positives of any query (1 in a pair batch, ``k``
    for image queries of a ranking batch). Positives keep their candidate order.
    """
    counts = pos.sum(-1, dtype=torch.int32)  # int32: 3x faster than summing booleans to int64
    a = max(int(counts.max()), 1) if pos.numel() else 1
    if a == 1:  # the booleans read as bytes (no copy)
        idx = (pos.view(torch.uint8) if pos.dtype == torch.bool else pos.to(torch.uint8)).argmax(-1, keepdim=True)
    elif bool((counts == a).all()):  # every query has a positives: no padding, no sort
        idx = pos.nonzero()[:, -1].reshape(*pos.shape[:-1], a)
        return idx, torch.ones_like(idx, dtype=torch.bool)
    else:
        idx = torch.sort(pos.to(torch.uint8), dim=-1, descending=True, stable=True).indices[..., :a]
    return idx, torch.gather(pos, -1, idx)


def any_along(mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``mask.any(dim)`` (over everything for ``None``) of a boolean mask, as the largest of its bytes (0 or 1):
    four times faster on the CPU than ``any``, whose boolean reduction is not vectorised."""
    if not mask.numel():  # amax has no value for an empty reduction
        return mask.any() if dim is None else mask.any(dim)
    top = mask.view(torch.uint8).amax() if dim is None else mask.view(torch.uint8).amax(dim)
    return top.view(torch.bool)


@dataclass(frozen=True)
class BatchLayout:
    """Which caption belongs to which image row, and which rows hold the same image.

    ``image_ids`` may carry leading batch dimensions (``(..., B)``) so that many
    batches with the same caption layout are handled in one tensor operation.
    """

    caption_image: torch.Tensor  # (M,) long: image row of each caption
    n_images: int  # B
    image_ids: torch.Tensor | None = None  # (..., B) dataset id of each image row
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(
        cls,
        n_images: int,
        n_captions: int,
        caption_image=None,
        image_ids=None,
        device: torch.device | str | None = None,
    ) -> BatchLayout:
        """Validate and build a layout; ``caption_image`` defaults to ``c // (M // B)``."""
        if n_images < 1 or n_captions < 1:
            raise CocosError(f"empty batch: {n_images} images, {n_captions} captions")
        if caption_image is None:
            if n_captions % n_images:
                raise CocosError(
                    f"{n_captions} captions is not a multiple of {n_images} images; "
                    "pass caption_image to say which caption belongs to which image"
                )
            k = n_captions // n_images
            caption_image = torch.arange(n_captions, device=device) // k
        else:
            caption_image = torch.as_tensor(caption_image, device=device)
            if caption_image.dtype.is_floating_point or caption_image.dtype == torch.bool:
                raise CocosError("caption_image must hold integer image rows")
            caption_image = caption_image.long()
            if caption_image.shape != (n_captions,):
                raise CocosError(
                    f"caption_image has shape {tuple(caption_image.shape)}, "
                    f"expected ({n_captions},)"
                )
            if n_captions and (caption_image.min() < 0 or caption_image.max() >= n_images):
                raise CocosError(f"caption_image values must lie in [0, {n_images})")
            lonely = torch.bincount(caption_image, minlength=n_images) == 0
            if lonely.any():
                raise CocosError(f"image row {int(lonely.nonzero()[0])} has no caption in the batch (no positive)")
        if image_ids is not None:
            image_ids = torch.as_tensor(image_ids, device=caption_image.device).long()
            if image_ids.shape[-1] != n_images:
                raise CocosError(
                    f"image_ids has {image_ids.shape[-1]} entries per batch, expected {n_images}"
                )
        return cls(caption_image=caption_image, n_images=n_images, image_ids=image_ids)

    def with_image_ids(self, image_ids) -> BatchLayout:
        """This layout for batches holding the images ``image_ids`` (``(..., B)``), sharing what does not depend on
        them (the positives and their indices), computed once in this layout."""
        for direction in DIRECTIONS:
            self.positive_index(direction)  # with oriented_positives
        out = BatchLayout.build(self.n_images, self.n_captions, self.caption_image, image_ids=image_ids)
        out._cache.update({key: value for key, value in self._cache.items()
                           if isinstance(key, tuple) and key[0] in ("oriented_positives", "positive_index")})
        return out

    @property
    def n_captions(self) -> int:
        return int(self.caption_image.shape[0])

    @property
    def group_size(self) -> int:
        """``k``: captions per image in the regular layout (``M // B``)."""
        return max(1, self.n_captions // self.n_images)

    @property
    def memo(self) -> dict:
        """A dict kept with the layout, for values computed from its masks alone (the counting engine's)."""
        return self._cache.setdefault("memo", {})

    def positives(self) -> torch.Tensor:
        """``(B, M)`` bool: caption ``c`` belongs to image row ``b``."""
        rows = torch.arange(self.n_images, device=self.caption_image.device)
        return rows[:, None] == self.caption_image[None, :]

    def oriented_positives(self, direction: str) -> torch.Tensor:
        """``(Q, K)`` bool: the positives of one direction (queries x candidates), the same for every batch of the
        layout (only the negatives depend on ``image_ids``), computed once."""
        key = ("oriented_positives", direction)
        if key not in self._cache:
            pos = self.positives()
            self._cache[key] = pos.T.contiguous() if direction == "t2i" else pos
        return self._cache[key]

    def positive_index(self, direction: str) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`positive_index` of :meth:`oriented_positives` (``(Q, A)`` each, the same for every batch),
        computed once: equal to that of any view's positives, which repeat these rows."""
        key = ("positive_index", direction)
        if key not in self._cache:
            self._cache[key] = positive_index(self.oriented_positives(direction))
        return self._cache[key]

    def same_image(self) -> torch.Tensor:
        """``(..., B, M)`` bool: not a positive, but the caption's image row holds the same image."""
        if "same_image" not in self._cache:  # computed once per layout
            pos = self.positives()
            if self.image_ids is None:
                return torch.zeros_like(pos)
            caption_ids = self.image_ids[..., self.caption_image]  # (..., M)
            same = self.image_ids[..., :, None] == caption_ids[..., None, :]
            self._cache["same_image"] = same & ~pos
        return self._cache["same_image"]

    def negatives(self, compat: bool = False) -> torch.Tensor:
        """``(..., B, M)`` bool: everything that is not a positive (and, unless compat, not a same-image pair)."""
        pos = self.positives()
        if self.image_ids is None:
            return ~pos
        lead = self.image_ids.shape[:-1]
        if compat:
            return (~pos).expand(*lead, *pos.shape)
        if "negatives" not in self._cache:  # computed once per layout
            self._cache["negatives"] = ~pos & ~self.same_image()
        return self._cache["negatives"]

    def masks(self, direction: str, compat: bool = False, shape=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pos, neg)`` oriented for one direction (queries x candidates), contiguous, computed once (``pos``
        is the same tensor in both modes). ``shape``: expanded to that shape (leading batch dimensions), also
        computed once."""
        if direction not in DIRECTIONS:
            raise CocosError(f"unknown direction '{direction}' (use i2t or t2i)")
        pos, neg = self._masks(direction, compat)
        if shape is None or tuple(pos.shape) == tuple(shape):
            return pos, neg
        shape = tuple(shape)
        for key, mask in ((("pos", direction, shape), pos), (("neg", direction, compat, shape), neg)):
            if key not in self._cache:
                self._cache[key] = mask.expand(shape).contiguous()
        return self._cache[("pos", direction, shape)], self._cache[("neg", direction, compat, shape)]

    def _masks(self, direction: str, compat: bool) -> tuple[torch.Tensor, torch.Tensor]:
        key = (direction, compat)
        if key not in self._cache:
            neg = self.negatives(compat)
            if direction == "t2i":
                neg = neg.transpose(-1, -2)
            if ("pos", direction) not in self._cache:  # one tensor for both modes
                self._cache[("pos", direction)] = self.oriented_positives(direction).expand(neg.shape).contiguous()
            self._cache[key] = (self._cache[("pos", direction)], neg.contiguous())
        return self._cache[key]

    def mode_rows(self, direction: str) -> torch.Tensor:
        """``(..., Q)`` bool: the query rows of a direction whose masks differ between the two counting modes,
        those with a same-image pair (a negative in compat mode, excluded otherwise)."""
        return any_along(self.same_image(), -1 if direction == "i2t" else -2)

    def view(self, scores: torch.Tensor, direction: str, compat: bool = False,
             intra: torch.Tensor | None = None) -> QueryView:
        """Orient a ``(..., B, M)`` similarity matrix as queries x candidates for one direction.

        ``intra`` (optional) is the queries' own intra-modal similarity matrix (``(..., Q, Q)``:
        images for i2t, captions for t2i), for losses with intra-modal terms (IMC).
        """
        pos, neg = self.masks(direction, compat)
        if direction == "t2i":
            scores = scores.transpose(-1, -2)
        shape = torch.broadcast_shapes(scores.shape, pos.shape)
        if pos.shape != shape:
            pos, neg = pos.expand(shape).contiguous(), neg.expand(shape).contiguous()
        return QueryView(scores=scores.expand(shape).contiguous(), pos=pos, neg=neg, direction=direction,
                         group_size=self.group_size, compat=compat, intra=intra)


@dataclass(frozen=True)
class QueryView:
    """One direction of a batch: ``scores[..., q, v]`` of query ``q`` and candidate ``v``.

    ``pos``/``neg`` are the masks of positive and negative candidates; a candidate
    in neither is excluded (a same-image pair outside compat mode). ``compat`` is
    the counting mode, decided once when the view is made: the masks follow it and
    every counter reads it from here (it is never passed separately), so a view
    always gives the values of exactly one mode.
    """

    scores: torch.Tensor  # (..., Q, K)
    pos: torch.Tensor  # (..., Q, K) bool
    neg: torch.Tensor  # (..., Q, K) bool
    direction: str
    group_size: int
    compat: bool = False
    intra: torch.Tensor | None = None  # (..., Q, Q) similarities among the queries (one modality), when needed

    @property
    def candidates(self) -> torch.Tensor:
        return self.pos | self.neg

    def excluded_pairs(self) -> torch.Tensor:
        """``(..., Q, K)`` bool: the pairs in neither mask (same-image pairs outside compat mode)."""
        return ~self.candidates

    @property
    def n_excluded(self) -> torch.Tensor:
        """Per batch: number of (query, candidate) pairs excluded as same-image pairs."""
        return self.excluded_pairs().sum(dim=(-1, -2))

    def excludes_any(self) -> bool:
        """Whether any (query, candidate) pair is excluded."""
        return bool(self.excluded_pairs().any())


def batch_similarity(
    images,
    captions,
    caption_image=None,
    image_ids=None,
    *,
    check: bool = True,
) -> tuple[torch.Tensor, BatchLayout]:
    """Normalise embeddings and return ``S = I Cᵀ`` (``(..., B, M)``) with the batch layout.

    ``images`` is ``(..., B, d)``, ``captions`` ``(..., M, d)`` (numpy or torch;
    float32 and float64 are kept, other dtypes become float32). With ``check``,
    shapes, NaN/Inf and zero vectors raise :class:`CocosError` with one line.
    """
    images, captions = unit_rows(images, captions, check=check)
    scores = images @ captions.transpose(-1, -2)
    layout = BatchLayout.build(
        images.shape[-2], captions.shape[-2], caption_image, image_ids, device=images.device
    )
    return scores, layout


def unit_rows(images, captions, *, check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The embeddings as :func:`batch_similarity` multiplies them: tensors on the images' device, float32 or float64
    (other dtypes become float32), each row divided by its norm; with ``check``, shapes, NaN/Inf and zero vectors
    are one :class:`CocosError` line. Counting in blocks (:mod:`cocos.counting.blocks`) takes rows of these."""
    images = torch.as_tensor(images)
    captions = torch.as_tensor(captions, device=images.device)
    if check:
        _check_shapes(images, captions)
    if images.dtype not in (torch.float32, torch.float64):
        images = images.float()
    captions = captions.to(images.dtype)
    image_norms = torch.linalg.vector_norm(images, dim=-1, keepdim=True)
    caption_norms = torch.linalg.vector_norm(captions, dim=-1, keepdim=True)
    if check:
        _check_norms("images", image_norms, images)
        _check_norms("captions", caption_norms, captions)
    return images / image_norms.clamp(min=1e-12), captions / caption_norms.clamp(min=1e-12)


def _check_norms(name: str, norms: torch.Tensor, values: torch.Tensor | None = None, offset: int = 0) -> None:
    """A row holding NaN or Inf has a non-finite norm; a zero vector has norm 0 (one check, no extra pass).
    ``offset``: the first row's index, where ``values`` is a block of a larger matrix."""
    norms = norms.squeeze(-1)
    bad = ~torch.isfinite(norms)
    if bad.any():
        row = int(bad.reshape(-1).nonzero()[0])
        if values is not None and bool(torch.isfinite(values.reshape(-1, values.shape[-1])[row]).all()):
            raise CocosError(f"{name} row {offset + row} is too large to normalise in {values.dtype} (its norm "
                             "overflows)")
        raise CocosError(f"{name} row {offset + row} holds NaN or Inf")
    zero = norms == 0
    if zero.any():
        raise CocosError(f"{name} row {offset + int(zero.reshape(-1).nonzero()[0])} is a zero vector (cannot be "
                         "normalised)")


def _check_shapes(images: torch.Tensor, captions: torch.Tensor) -> None:
    for name, x in (("images", images), ("captions", captions)):
        if x.dtype == torch.bool or x.is_complex():
            raise CocosError(f"{name} must be real-valued, got {x.dtype}")
        if x.ndim < 2:
            raise CocosError(f"{name} must be a (n, d) matrix, got shape {tuple(x.shape)}")
        if x.shape[-2] == 0 or x.shape[-1] == 0:
            raise CocosError(f"{name} is empty (shape {tuple(x.shape)})")
    if images.shape[-1] != captions.shape[-1]:
        raise CocosError(
            f"images have dimension {images.shape[-1]} but captions have {captions.shape[-1]}"
        )


def _check_embeddings(images: torch.Tensor, captions: torch.Tensor) -> None:
    """Shapes, NaN/Inf and zero vectors of two embedding matrices; one CocosError line on failure."""
    _check_shapes(images, captions)
    for name, x in (("images", images), ("captions", captions)):
        x = x if x.dtype in (torch.float32, torch.float64) else x.float()
        _check_norms(name, torch.linalg.vector_norm(x, dim=-1, keepdim=True), x)
