"""Benchmark of one VSE∞ training step: cocos against woodfrog/vse_infty's code, the same weights and inputs.

A full training step at the paper's sizes (batch 128, 36 regions of 2048-d, a BERT-base of random weights
(``BertConfig()``'s sizes: hidden 768, 12 layers, 12 heads; the step's cost does not depend on the values),
captions of 10..25 word pieces zero padded, embed 1024): the forward pass of both encoders, the max-violation
hinge loss (margin 0.2), backward, gradient norm clipped at 2, AdamW (weight decay 1e-4) with the BERT at lr/10.

* **cocos**: ``VSEInfty`` in train mode, ``model(features, tokens, lengths)`` (its region dropout included), the
  ``triplet_sh`` loss as the trainer calls it, and the trainer's own ``parameter_groups`` / ``_optimizer`` /
  ``optimize`` (VSE∞'s recipe, :data:`cocos.models.builtin.VSE_INFTY_RECIPE`) on a stand-in of the trainer.
* **reference**: ``tests/reference_vse_infty.py``'s encoders (woodfrog/vse_infty's ``EncoderImageAggr`` and
  ``EncoderText`` restated) with cocos's weights loaded, ``contrastive_loss(max_violation=True)``, their AdamW groups
  (``lib/vse.py``). GPO's pooling weights are computed as the original ``lib/modules/aggr/gpo.py`` does (encodings
  cached per length and moved to the lengths' device, ``flatten_parameters``): the test restatement builds them on
  the CPU, which the oracle needs and a GPU cannot run. Their inputs are prepared as their loader does, outside the
  step (``PrecompRegionDataset.__getitem__``: each region kept where ``np.random.rand() > 0.2``; ``collate_fn``: zero
  padded to the batch's longest; pinned memory on CUDA); that preparation is timed on its own.

Both steps start from CPU tensors (the host-to-device copy is in the step, as in both training loops) and end with
the loss read back as a float (both loops log it). Repetitions alternate (cocos first in even rounds, the reference
in odd ones) after one warm-up step each; the ratio cocos / reference is of the medians of the same run. On CUDA
the device is synchronised around each timed step and the peak memory of each step above what was resident before
it is recorded.

Both sides run in one process under one OpenMP wait policy (``--omp cocos``: the one ``cocos train`` chooses from
the load; on a busy CPU OpenMP's spinning default makes every small operator wait for a descheduled thread).

    python benchmarks/bench_vse_infty.py [--quick] [--device auto|cpu|cuda] [--amp off|bf16] [--repeats 5]
        [--batch-size N] [--bert-layers N] [--threads N] [--omp cocos|default] [--profile]
        [--out benchmarks/results/vse_infty_step.json]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests/reference_vse_infty.py is imported as tests.reference_vse_infty
    sys.path.insert(0, str(ROOT))


def _openmp_policy(argv: list[str]) -> dict[str, str]:
    """``--omp cocos`` (the default): the OpenMP wait policy ``cocos train`` sets from the load before torch loads
    (:mod:`cocos.openmp`), for both sides alike; ``--omp default``: OpenMP's own. On a busy CPU the difference is
    tenfold for small operators (two spinning threads wait for a descheduled third), whatever the code."""
    if "--omp=default" in argv or any(a == "--omp" and b == "default" for a, b in zip(argv, argv[1:], strict=False)):
        return {}
    from cocos.openmp import configure

    threads = None
    for i, arg in enumerate(argv):
        text = arg.partition("=")[2] if arg.startswith("--threads=") else (
            argv[i + 1] if arg == "--threads" and i + 1 < len(argv) else "")
        threads = int(text) if text.isdigit() and int(text) > 0 else threads
    return configure("train", threads=threads)


OPENMP_SET = _openmp_policy(sys.argv[1:]) if __name__ == "__main__" else {}

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cocos.data.text import pad_batch  # noqa: E402
from cocos.device import resolve_device  # noqa: E402
from cocos.errors import CocosError  # noqa: E402
from cocos.models.builtin import VSE_INFTY_RECIPE  # noqa: E402
from cocos.models.vse_infty import VSEInfty  # noqa: E402
from cocos.objectives import get_loss  # noqa: E402
from cocos.training.config import OptimConfig  # noqa: E402
from cocos.training.trainer import Trainer  # noqa: E402
from tests import reference_vse_infty as ref  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "vse_infty_step.json"
MARGIN = 0.2
CLS_ID, SEP_ID, FIRST_WORD_ID = 101, 102, 1000  # bert-base-uncased's [CLS], [SEP], and where its words begin
FULL = dict(batch_size=128, bert_layers=12, repeats=5, warmup=1)
QUICK = dict(batch_size=32, bert_layers=4, repeats=3, warmup=1)
CUDA_STEPS = dict(repeats=20, warmup=3)  # a GPU step takes a fraction of a second: more of them, and more warm-up


# --- the reference's GPO as the original runs it on any device --------------------------------------------------

class DeviceGPO(ref.GPO):
    """``lib/modules/aggr/gpo.py: GPO.compute_pool_weights`` as the original: the positional encodings cached per
    length (``get_pe``) and moved, with the mask, to the lengths' device; ``gru.flatten_parameters()``."""

    def __init__(self, d_pe: int = 32, d_hidden: int = 32) -> None:
        super().__init__(d_pe, d_hidden)
        self.pe_database: dict[int, torch.Tensor] = {}

    def get_pe(self, length: int) -> torch.Tensor:
        if length not in self.pe_database:
            self.pe_database[length] = ref.positional_encoding_1d(self.d_pe, length)
        return self.pe_database[length]

    def compute_pool_weights(self, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        max_len = int(lengths.max())
        pes = self.get_pe(max_len).unsqueeze(0).repeat(lengths.size(0), 1, 1).to(lengths.device)
        mask = torch.arange(max_len).expand(lengths.size(0), max_len).to(lengths.device)
        mask = (mask < lengths.long().unsqueeze(1)).unsqueeze(-1)
        pes = pes.masked_fill(mask == 0, 0)
        self.gru.flatten_parameters()
        packed = torch.nn.utils.rnn.pack_padded_sequence(pes, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.gru(packed)
        out_emb, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        half = out_emb.size(2) // 2
        out_emb = (out_emb[:, :, :half] + out_emb[:, :, half:]) / 2
        scores = self.linear(out_emb)
        scores[torch.where(mask == 0)] = -10000
        return torch.softmax(scores / 0.1, 1), mask


def _device_gpo(encoder: torch.nn.Module) -> None:
    gpo = DeviceGPO(encoder.gpool.d_pe, encoder.gpool.d_hidden)
    gpo.load_state_dict(encoder.gpool.state_dict())
    encoder.gpool = gpo


# --- the two sides ------------------------------------------------------------------------------------------------

def bert_config(layers: int) -> dict:
    """``BertConfig()``'s sizes (BERT-base), ``layers`` deep."""
    from transformers import BertConfig

    base = BertConfig()
    return dict(vocab_size=base.vocab_size, hidden_size=base.hidden_size, num_hidden_layers=int(layers),
                num_attention_heads=base.num_attention_heads, intermediate_size=base.intermediate_size)


def build_cocos(cfg: dict, img_dim: int, embed: int, device: torch.device):
    """VSEInfty, its loss, and a stand-in of the trainer whose own methods build the optimiser and take the step."""
    model = VSEInfty(cfg["vocab_size"], img_dim, cfg, embed).to(device)
    optim = OptimConfig(**{f.name: VSE_INFTY_RECIPE[f.name] for f in fields(OptimConfig) if f.name in VSE_INFTY_RECIPE})
    trainer = SimpleNamespace(model=model, hooks=[], images=False,
                              cfg=SimpleNamespace(optim=optim, model=SimpleNamespace(name="vse_infty")))
    trainer.parameter_groups = lambda: Trainer.parameter_groups(trainer)
    trainer.trained_parameters = lambda: Trainer.trained_parameters(trainer)
    trainer.optimizer = Trainer._optimizer(trainer)
    return model, get_loss("triplet_sh", margin=MARGIN), trainer


def build_reference(model: VSEInfty, cfg: dict, img_dim: int, embed: int, device: torch.device, optim: OptimConfig):
    """vse_infty's encoders with cocos's weights, and their AdamW (``lib/vse.py``, ``precomp_enc_type == 'basic'``)."""
    img_enc = ref.EncoderImageAggr(img_dim, embed, "basic")
    txt_enc = ref.EncoderText(dict(cfg), embed)
    img_enc.load_state_dict(model.img_enc.state_dict(), strict=True)
    txt_enc.load_state_dict(model.txt_enc.state_dict(), strict=True)
    _device_gpo(img_enc)
    _device_gpo(txt_enc)
    img_enc.to(device)
    txt_enc.to(device)
    bert_ptrs = {p.data_ptr() for p in txt_enc.bert.parameters()}
    lr = optim.lr
    optimizer = torch.optim.AdamW([
        {"params": [p for p in txt_enc.parameters() if p.data_ptr() not in bert_ptrs], "lr": lr},
        {"params": list(txt_enc.bert.parameters()), "lr": lr * 0.1},
        {"params": img_enc.parameters(), "lr": lr},
    ], lr=lr, weight_decay=1e-4)
    params = list(txt_enc.parameters()) + list(img_enc.parameters())
    return img_enc, txt_enc, optimizer, params


def make_inputs(batch: int, regions: int, img_dim: int, vocab: int, seed: int):
    """Region features (numpy, as their ``np.load``), captions of 10..25 word pieces ([CLS] ... [SEP])."""
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, regions, img_dim, generator=gen).numpy()
    lengths = torch.randint(10, 26, (batch,), generator=gen).tolist()
    captions = [[CLS_ID, *torch.randint(FIRST_WORD_ID, vocab, (n - 2,), generator=gen).tolist(), SEP_ID]
                for n in lengths]
    return features, captions


def reference_batch(features: np.ndarray, captions: list, rng: np.random.RandomState, pin: bool):
    """Their loader's batch: ``__getitem__``'s region drop (numpy), ``collate_fn``'s padding, pinned on CUDA."""
    images = []
    for image in features:
        rand_list = rng.rand(image.shape[0])
        images.append(torch.Tensor(image[np.where(rand_list > 0.20)]))
    all_images, img_lengths = ref.collate_regions(images)
    targets, lengths = ref.collate_captions(captions)
    if pin:
        all_images, img_lengths, targets = all_images.pin_memory(), img_lengths.pin_memory(), targets.pin_memory()
    return all_images, img_lengths, targets, lengths


# --- timing -------------------------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step, device: torch.device) -> tuple[float, float, float | None]:
    """(seconds, loss, peak MB of the step above what was resident before it; None off CUDA)."""
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    loss = step()
    sync(device)
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else None
    return seconds, loss, peak


def autocast(device: torch.device, amp: str):
    return torch.autocast(device.type, dtype=torch.bfloat16) if amp == "bf16" else nullcontext()


def run(args) -> dict:
    device = resolve_device(args.device)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # lib/vse.py sets it; one process, so for both sides
    cfg = bert_config(args.bert_layers)
    batch, regions, img_dim, embed = args.batch_size, args.regions, args.img_dim, args.embed_size

    start = time.perf_counter()
    model, loss_fn, trainer = build_cocos(cfg, img_dim, embed, device)
    img_enc, txt_enc, ref_optimizer, ref_params = build_reference(model, cfg, img_dim, embed, device,
                                                                  trainer.cfg.optim)
    build_s = time.perf_counter() - start
    features, captions = make_inputs(batch, regions, img_dim, cfg["vocab_size"], args.seed)
    features_t = torch.from_numpy(features)  # cocos's features_for: a fresh CPU tensor of the batch's rows
    tokens, lengths = pad_batch(captions)  # the trainer's padding
    ref_tokens, _ = ref.collate_captions(captions)
    assert torch.equal(tokens, ref_tokens)
    caption_image = np.arange(batch)  # the trainer's pair batch: caption c of image row c
    image_rows = np.arange(batch)

    # the same weights: embeddings of a few rows, eval mode, all regions, no augmentation
    model.eval(), img_enc.eval(), txt_enc.eval()
    rows = min(4, batch)
    with torch.no_grad():
        ours = model(features_t[:rows].to(device), tokens[:rows].to(device), lengths[:rows])
        full = torch.full((rows,), float(regions), device=device)
        theirs = (img_enc(features_t[:rows].to(device), full),
                  txt_enc(ref_tokens[:rows].to(device), torch.Tensor(lengths[:rows].tolist()).to(device)))
    max_diff = max(float((a - b).abs().max()) for a, b in zip(ours, theirs, strict=True))
    model.train(), img_enc.train(), txt_enc.train()

    def cocos_step() -> float:
        feats = features_t.to(device)
        with autocast(device, args.amp):
            img_emb, cap_emb = model(feats, tokens.to(device), lengths)
            loss = loss_fn(img_emb, cap_emb, caption_image=caption_image,
                           image_ids=torch.as_tensor(image_rows, device=device))
        Trainer.optimize(trainer, loss, False)
        return float(loss.detach())

    rng = np.random.RandomState(args.seed)
    prep_times: list[float] = []
    pending: list = []

    def next_reference_batch():
        t0 = time.perf_counter()
        out = reference_batch(features, captions, rng, pin=device.type == "cuda")
        prep_times.append(time.perf_counter() - t0)
        return out

    def reference_step() -> float:
        images, img_lengths, targets, cap_lengths = pending.pop()
        images, img_lengths, targets = images.to(device), img_lengths.to(device), targets.to(device)
        with autocast(device, args.amp):
            img_emb = img_enc(images, img_lengths)
            cap_emb = txt_enc(targets, torch.Tensor(cap_lengths).to(device))
            ref_optimizer.zero_grad()
            loss = ref.contrastive_loss(img_emb, cap_emb, margin=MARGIN, max_violation=True)
        value = loss.item()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref_params, 2.0)
        ref_optimizer.step()
        return value

    results = {"cocos": [], "reference": []}

    def one(side: str, record: bool) -> None:
        if side == "reference":
            pending.append(next_reference_batch())
        seconds, loss, peak = timed(cocos_step if side == "cocos" else reference_step, device)
        # gradients dropped outside the step (both loops set them to None at zero_grad): equal baselines for memory
        trainer.optimizer.zero_grad(set_to_none=True)
        ref_optimizer.zero_grad(set_to_none=True)
        if record:
            results[side].append({"seconds": seconds, "loss": loss, "peak_mb": peak})
        if args.verbose:
            print(f"  {side:<9} {'' if record else 'warm-up '}{seconds:8.3f} s  loss {loss:.4f}", flush=True)

    for _ in range(args.warmup):
        one("cocos", False)
        one("reference", False)
    for i in range(args.repeats):
        for side in (("cocos", "reference") if i % 2 == 0 else ("reference", "cocos")):
            one(side, True)

    profile = profile_steps(args, device, cocos_step, reference_step, next_reference_batch, pending) \
        if args.profile else None
    return summarise(args, device, cfg, results, prep_times, build_s, max_diff, profile)


def profile_steps(args, device, cocos_step, reference_step, next_reference_batch, pending) -> dict:
    """One step of each under torch.profiler: the operators with the most self time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    out = {}
    for side, step in (("cocos", cocos_step), ("reference", reference_step)):
        if side == "reference":
            pending.append(next_reference_batch())
        with profile(activities=activities) as prof:
            step()
            sync(device)
        events = prof.key_averages()
        if key == "self_device_time_total" and events and not hasattr(events[0], key):  # torch before 2.4
            key = "self_cuda_time_total"
        table = events.table(sort_by=key, row_limit=args.profile_rows)
        print(f"\n### profile: {side} (sorted by {key})\n\n{table}")
        out[side] = table
    return out


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def summarise(args, device, cfg, results, prep_times, build_s, max_diff, profile) -> dict:
    def side(rows):
        times = [r["seconds"] for r in rows]
        peaks = [r["peak_mb"] for r in rows if r["peak_mb"] is not None]
        med = statistics.median(times)
        return {"seconds": times, "median_s": med, "min_s": min(times), "max_s": max(times),
                "captions_per_s": args.batch_size / med, "loss_median": statistics.median(r["loss"] for r in rows),
                "peak_step_mb": max(peaks) if peaks else None}

    cocos, reference = side(results["cocos"]), side(results["reference"])
    pairs = [c["seconds"] / r["seconds"] for c, r in zip(results["cocos"], results["reference"], strict=True)]
    machine = {"machine": platform.machine(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
               "torch": torch.__version__, "python": platform.python_version(), "device": str(device),
               "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
               "load_average": [round(x, 2) for x in os.getloadavg()],
               "openmp": {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")
                          if k in os.environ}}
    try:
        import transformers

        machine["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover - the reference needs it anyway
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "benchmark": "vse_infty_step",
        "mode": args.mode,
        "machine": machine,
        "sizes": {"batch_size": args.batch_size, "regions": args.regions, "img_dim": args.img_dim,
                  "embed_size": args.embed_size, "caption_word_pieces": [10, 25], "bert": cfg},
        "settings": {"amp": args.amp, "omp": args.omp, "warmup": args.warmup, "repeats": args.repeats,
                     "seed": args.seed, "margin": MARGIN, "grad_clip": 2.0,
                     "optimizer": "AdamW, weight decay 1e-4, BERT at lr/10"},
        "cocos": cocos,
        "reference": reference,
        "ratio_cocos_over_reference": cocos["median_s"] / reference["median_s"],
        "ratio_per_round": pairs,
        "reference_input_prep_median_s": statistics.median(prep_times) if prep_times else None,
        "build_s": build_s,
        "max_abs_diff_eval_embeddings": max_diff,
        "process_peak_rss_mb": ru / 1024 if sys.platform != "darwin" else ru / 2**20,
        "profile": profile,
    }


def markdown(res: dict) -> str:
    m, s = res["machine"], res["sizes"]
    bert = s["bert"]
    lines = [
        f"VSE∞ training step ({res['mode']}): batch {s['batch_size']}, {s['regions']} x {s['img_dim']} regions, "
        f"BERT {bert['num_hidden_layers']} layers / hidden {bert['hidden_size']} / {bert['num_attention_heads']} "
        f"heads, embed {s['embed_size']}, captions 10..25 word pieces; amp {res['settings']['amp']}",
        f"{m['machine']}, {m['cpu_count']} CPUs ({m['torch_threads']} torch threads), torch {m['torch']}, "
        f"device {m['device']} ({m['device_name']}), load {m['load_average'][0]}, OpenMP "
        f"{' '.join(f'{k}={v}' for k, v in m['openmp'].items()) or 'default'}; "
        f"{res['settings']['warmup']} warm-up + {res['settings']['repeats']} alternated steps each",
        "",
        "| side | median s/step | min s | max s | captions/s | peak MB of a step |",
        "| --- | --: | --: | --: | --: | --: |",
    ]
    for name in ("cocos", "reference"):
        r = res[name]
        peak = "—" if r["peak_step_mb"] is None else f"{r['peak_step_mb']:,.0f}"
        lines.append(f"| {name} | {r['median_s']:.3f} | {r['min_s']:.3f} | {r['max_s']:.3f} | "
                     f"{r['captions_per_s']:,.1f} | {peak} |")
    ratios = ", ".join(f"{x:.2f}" for x in res["ratio_per_round"])
    lines += ["", f"cocos / reference: **{res['ratio_cocos_over_reference']:.2f}x** (medians; per round: {ratios})",
              f"reference input preparation (their loader, outside the step): "
              f"{res['reference_input_prep_median_s'] * 1000:.1f} ms; process peak RSS "
              f"{res['process_peak_rss_mb']:,.0f} MB; eval embeddings, same weights: max |diff| "
              f"{res['max_abs_diff_eval_embeddings']:.1e}"]
    return "\n".join(lines)


def write(path: Path, res: dict) -> None:
    try:
        from cocos.io import write_json
    except ImportError:  # pragma: no cover
        import json

        def write_json(p, obj):
            Path(p).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, res)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"batch {QUICK['batch_size']}, BERT {QUICK['bert_layers']} layers, "
                             f"{QUICK['repeats']} repetitions")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--amp", default="off", choices=["off", "bf16"],
                        help="bf16 autocast around both sides' forward and loss (neither training loop uses it)")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--bert-layers", type=int, default=None)
    parser.add_argument("--regions", type=int, default=36)
    parser.add_argument("--img-dim", type=int, default=2048)
    parser.add_argument("--embed-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=None,
                        help="alternated timed steps of each side (5, --quick 3; on CUDA 20)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps of each side first (1; on CUDA 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--omp", default="cocos", choices=["cocos", "default"],
                        help="OpenMP wait policy of both sides: as `cocos train` sets it from the load, or OpenMP's")
    parser.add_argument("--profile", action="store_true", help="then one step of each under torch.profiler")
    parser.add_argument("--profile-rows", type=int, default=20)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("-v", "--verbose", action="store_true", help="print every step")
    args = parser.parse_args(argv)
    preset = dict(QUICK if args.quick else FULL)
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
        preset.update(CUDA_STEPS)
    args.mode = "quick" if args.quick else "full"
    if any(getattr(args, name) not in (None, preset[name]) for name in ("batch_size", "bert_layers")) or (
            args.regions, args.img_dim, args.embed_size) != (36, 2048, 1024):
        args.mode += ", custom sizes"
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.batch_size < 2 or args.bert_layers < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--batch-size >= 2, --bert-layers >= 1, --repeats >= 1, --warmup >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        res = run(args)
    except CocosError as exc:  # e.g. --device cuda without CUDA: one line
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    write(args.out, res)
    print(markdown(res))
    print(f"\nwritten: {args.out}")
    if not math.isfinite(res["ratio_cocos_over_reference"]):  # pragma: no cover
        sys.exit(1)


if __name__ == "__main__":
    main()
