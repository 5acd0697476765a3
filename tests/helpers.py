"""Test helpers: embeddings that realise a chosen similarity matrix exactly; file snapshots and the one-line
error check of the CLI."""

from __future__ import annotations

import numpy as np


def embed_similarities(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors ``images`` (B, B+M) and ``captions`` (M, B+M) with ``images @ captions.T == s``.

    Image ``i`` is the one-hot ``e_i``; caption ``j`` is ``(s[:, j], pad)`` with its
    own padding axis so that it has unit norm (needs column norms <= 1).
    """
    s = np.asarray(s, dtype=np.float64)
    b, m = s.shape
    norms = (s * s).sum(0)
    assert (norms <= 1).all(), "every column of s needs norm <= 1"
    images = np.zeros((b, b + m))
    images[:, :b] = np.eye(b)
    captions = np.zeros((m, b + m))
    captions[:, :b] = s.T
    captions[np.arange(m), b + np.arange(m)] = np.sqrt(1 - norms)
    return images, captions


def snapshot(*folders) -> dict:
    """Every file under the folders with its bytes (hidden temporaries included): compare before and after."""
    from pathlib import Path

    out = {}
    for folder in folders:
        for p in sorted(Path(folder).rglob("*")):
            out[str(p)] = p.read_bytes() if p.is_file() else None
    return out


def one_error_line(res) -> str:
    """A CLI result that is bad input: exit code 2 and exactly one line, ``error: ...``; returns it."""
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0]


def memoise_pdf_font_subsets():
    """Make matplotlib subset a font for a PDF once per (font, glyphs) in this process; returns an undo function
    (``None`` where matplotlib's internals are not the expected ones: then nothing changes).

    Every cocos figure is written as PDF with TrueType fonts embedded (``pdf.fonttype`` 42): matplotlib re-reads
    and subsets DejaVu Sans with fontTools for each file, about two thirds of a PDF's time; the tests write
    hundreds of PDFs of a few glyph sets. The cached bytes are the ones matplotlib produced for the same font and
    glyphs, so every file is byte-identical to one written without this (tests/test_suite_speed.py checks it).
    """
    import contextlib
    import io

    try:
        from matplotlib.backends import _backend_pdf_ps as pdfps
    except ImportError:
        return None
    original_subset = getattr(pdfps, "get_glyphs_subset", None)
    original_as_file = getattr(pdfps, "font_as_file", None)
    results = getattr(pdfps, "SubsetResults", None)
    if original_subset is None or original_as_file is None or results is None:
        return None
    cache: dict = {}

    class Saved:
        """A subset font as the bytes matplotlib wrote for it."""

        def __init__(self, data: bytes):
            self.data = data

    @contextlib.contextmanager
    def get_glyphs_subset(fontfile, glyphs):
        glyphs = tuple(sorted(glyphs))
        key = (str(fontfile), getattr(fontfile, "face_index", 0), glyphs)
        if key not in cache:
            with original_subset(fontfile, set(glyphs)) as subset:
                cache[key] = (original_as_file(subset.font).getvalue(), dict(subset.glyph_index_map))
        data, index_map = cache[key]
        yield results(Saved(data), dict(index_map))

    def font_as_file(font):
        return io.BytesIO(font.data) if isinstance(font, Saved) else original_as_file(font)

    get_glyphs_subset.original, get_glyphs_subset.cache = original_subset, cache
    font_as_file.original = original_as_file
    pdfps.get_glyphs_subset, pdfps.font_as_file = get_glyphs_subset, font_as_file

    def undo():
        pdfps.get_glyphs_subset, pdfps.font_as_file = original_subset, original_as_file

    return undo


def empty_figures(monkeypatch, formats=None) -> None:
    """Figures written as empty files instead of rendered (about 2 s an analysis), for tests that are not about
    figures; ``formats`` (e.g. ``{"pdf"}``): only the files of these formats, the others drawn."""
    from pathlib import Path

    from matplotlib.figure import Figure

    drawn = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        if formats is not None and kwargs.get("format") not in formats:
            return drawn(self, fname, *args, **kwargs)
        if hasattr(fname, "write"):
            fname.write(b"")
        else:
            Path(fname).write_bytes(b"")

    monkeypatch.setattr(Figure, "savefig", savefig)


def figures_empty(formats=None):
    """:func:`empty_figures` as a context manager, for module fixtures (no ``monkeypatch`` there)."""
    import contextlib

    import pytest

    @contextlib.contextmanager
    def context():
        with pytest.MonkeyPatch.context() as mp:
            empty_figures(mp, formats)
            yield

    return context()


CLIP_LETTERS = "abcdefghijklmnopqrstuvwxyz"
CLIP_MERGES = ["t h", "th e</w>", "a n", "o n</w>", "i n", "e d</w>", "r e"]


def make_clip_folder(folder, *, image_size=30, max_positions=16, seed=0, logit_scale=3.5, legacy_eos=False):
    """A tiny random CLIP folder as save_pretrained writes it: a letter BPE (a few merges), two-block towers, a
    logit scale other than CLIP's initial one; ``legacy_eos``: ``eos_token_id = 2`` in the config, as OpenAI's
    configs were saved (transformers then pools the largest id, not the first eos)."""
    import json

    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    tokens = [c for ch in CLIP_LETTERS for c in (ch, ch + "</w>")]
    tokens += [a + b for a, b in (m.split() for m in CLIP_MERGES)]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(CLIP_MERGES) + "\n")
    tok = transformers.CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    tok.save_pretrained(str(folder))
    torch.manual_seed(seed)
    text = dict(vocab_size=len(tokens), hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=max_positions,
                eos_token_id=2 if legacy_eos else len(tokens) - 1,
                bos_token_id=len(tokens) - 2, pad_token_id=len(tokens) - 1)
    vision = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                  image_size=image_size, patch_size=6)
    model = transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=24))
    with torch.no_grad():
        model.logit_scale.fill_(logit_scale)
    model.save_pretrained(str(folder))
    transformers.CLIPImageProcessorPil(size={"shortest_edge": image_size},
                                       crop_size={"height": image_size, "width": image_size}).save_pretrained(
        str(folder))
    return folder


def synth_words(data) -> list[str]:
    """The words of the world's captions as a BERT splits them (its normaliser and pre-tokeniser)."""
    from tokenizers import normalizers, pre_tokenizers

    norm, split = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = set()
    for name in ("train", "dev", "test"):
        for line in (data / f"{name}_caps.txt").read_text().splitlines():
            words.update(w for w, _ in split.pre_tokenize_str(norm.normalize_str(line)))
    return sorted(words)
