"""Benchmark: counting a CLIP-size pair batch in blocks (issue 39, "Big batches").

:func:`cocos.counting.blocks.count_batch_values` counts a batch whose whole count would need more than its budget
(256 MB of temporaries by default: pair batches above 2,048 x 2,048) in blocks of query rows, each block computing
its own similarity rows and masks. The issue's acceptance: the counting cost per pair flat from batch 1,024 to
8,192 on the CPU, its memory under 1 GB; on a GPU, one 32,768 x 32,768 batch within twice the bare similarity
matmul and threshold.

**CPU scan** (default): pair batches of B = ``--sizes`` (1,024 ... 8,192) random unit embeddings (d = ``--dim``,
float32, seed 0), both directions counted with each of the paper's counters (Triplet, Triplet SH, NT-Xent,
SmoothAP, at their defaults; SmoothAP on the pair layout, one positive per query) and SigLIP's where the registry
has it (``siglip``; a printed line otherwise), at the library's default budget, and the floor: the bare similarity
matmul and one threshold (``(I @ C.T > 0.2).sum(-1)``: what any count must do at least). Each (size, item) runs in
a fresh process, in increasing order of size: torch and cocos imported, the embeddings made, one warm-up count on a
256-pair batch (whole and in blocks), then the first timed count, whose peak memory is the growth of the process's
RSS high-water mark (``resource.getrusage``; torch's CPU allocator keeps no statistics and tracemalloc does not see
it) over the warmed-up process; then counts and floors alternate (``--repeats`` in all, fewer for big batches) and
the best of each gives the ratio count / floor measured in that process. Figures: ns per pair (``time / B²``, both
directions together), peak growth and the process's whole peak (Python, torch and the embeddings included).
OpenMP's wait policy is the one ``cocos count`` would choose from the load (:func:`cocos.openmp.configure`).

**Device** (``--device cuda``, or ``--inprocess`` on the CPU to try the same code on small sizes): one process,
for each of ``--sizes`` (default 32,768 on CUDA): the floor and every counter timed in the same process
(synchronised, best of ``--repeats`` after a warm-up), peak device memory above what was allocated before
(``torch.cuda.max_memory_allocated``; RSS growth on the CPU), the ratio to the floor (the target: at most 2), and
at ``--check-size`` (default 4,096) the largest relative difference between the blocked and the whole count of
each statistic on that device (cuBLAS may round a block of rows differently from the whole product).
``--budget`` sets the blocks' byte budget (default: the library's, 256 MB; ``auto``: a quarter of the device's free
memory on CUDA).

    python benchmarks/big_batch.py [--sizes 1024,2048,4096,8192] [--dim 512] [--repeats 3] [--out PATH]
    python benchmarks/big_batch.py --device cuda [--sizes 32768] [--budget auto] [--out $OUT/big_batch_cuda.json]
    python benchmarks/big_batch.py --inprocess --sizes 1024 --check-size 512      # the device path on the CPU

Results go to ``--out`` (``benchmarks/results/big_batch_cpu.json``, ``big_batch_<device>.json``) with the machine,
torch, the commit and every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAPER = ("triplet", "triplet_sh", "ntxent", "smoothap")
FLOOR = "floor"
THRESHOLD = 0.2  # the floor's threshold (the Triplet margin)
WARM = 256  # pairs of the warm-up batch


def families() -> list[str]:
    """The paper's counters and SigLIP's where the registry has it (a printed line otherwise)."""
    from cocos.errors import CocosError
    from cocos.objectives import get_objective

    try:
        get_objective("siglip")
    except CocosError:
        print("siglip: not registered (cocos.objectives.get_objective('siglip') fails): skipped", flush=True)
        return list(PAPER)
    return [*PAPER, "siglip"]


def commit() -> dict:
    """The checkout's commit and whether it has local changes (read-only git commands)."""
    def git(*args):
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine(device: str = "cpu") -> dict:
    import torch

    out = {"machine": platform.machine(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
           "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
           "device": device, "load_average": [round(x, 2) for x in os.getloadavg()],
           "openmp": {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")
                      if k in os.environ}}
    if device.startswith("cuda"):
        out["device_name"] = torch.cuda.get_device_name(torch.device(device))
        out["cuda"] = torch.version.cuda
    return out


def embeddings(n: int, dim: int, device="cpu", seed: int = 0):
    """``n`` image and ``n`` caption rows of random unit vectors (float32)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    images = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=-1)
    captions = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=-1)
    return images.to(device), captions.to(device)


def floor(images, captions):
    """The bare similarity matmul and one threshold: each query's number of candidates above it."""
    return (images @ captions.T > THRESHOLD).sum(-1)


def run_item(item: str, images, captions, budget):
    from cocos.counting.blocks import count_batch_values

    if item == FLOOR:
        return floor(images, captions)
    return count_batch_values(images, captions, item, budget=budget)


def maxrss_mb() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru / 2**20 if sys.platform == "darwin" else ru / 1024


def blocked(item: str, n: int, budget) -> bool:
    """Whether ``count_batch_values`` counts this pair batch in blocks."""
    if item == FLOOR:
        return False
    from cocos.counting import get_counter
    from cocos.counting.blocks import BLOCK_BUDGET, whole_bytes

    counter = get_counter(item)
    limit = BLOCK_BUDGET if budget is None else budget
    return whole_bytes(n, n, None, 4) > limit and all(counter.blocks(d, False) for d in ("i2t", "t2i"))


# ---------------------------------------------------------------------- CPU scan: one process per size


def status_mb() -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` (its high-water mark) of this process in MB (Linux; empty elsewhere)."""
    out = {}
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line[:5]] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


def reset_high_water() -> bool:
    """Reset this process's RSS high-water mark (Linux >= 4.0: ``5`` to ``/proc/self/clear_refs``; it resets
    ``getrusage``'s ``ru_maxrss`` too); whether it could."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def child(items: list[str], n: int, dim: int, repeats: int) -> list[dict]:
    """Every item at one size in this fresh process (module docstring, "CPU scan")."""
    import torch

    images, captions = embeddings(n, dim)
    warm_i, warm_c = embeddings(WARM, dim, seed=1)
    for item in items:
        run_item(item, warm_i, warm_c, None)
        if item != FLOOR:
            run_item(item, warm_i, warm_c, 3000)  # the blocked path too
    out = []
    for item in items:
        reset = reset_high_water()
        before = status_mb().get("VmRSS", maxrss_mb())
        start = time.perf_counter()
        run_item(item, images, captions, None)
        first = time.perf_counter() - start
        peak = maxrss_mb()  # since the reset, or since the process started where it could not be reset
        times, floors = [first], []
        for i in range(repeats):  # floors and counts alternate (a shared machine's drifts hit both)
            if item != FLOOR:
                start = time.perf_counter()
                floor(images, captions)
                floors.append(time.perf_counter() - start)
            if i + 1 < repeats:
                start = time.perf_counter()
                run_item(item, images, captions, None)
                times.append(time.perf_counter() - start)
        best = min(times)
        row = {"item": item, "size": n, "dim": dim, "pairs": n * n, "blocked": blocked(item, n, None),
               "seconds": times, "best_s": best, "ns_per_pair": best / (n * n) * 1e9, "peak_mb": peak,
               "growth_mb": peak - before, "high_water_reset": reset, "torch_threads": torch.get_num_threads(),
               "load_average": round(os.getloadavg()[0], 2)}
        if floors:
            row.update(floor_s=floors, floor_best_s=min(floors), ratio_to_floor=best / min(floors))
        out.append(row)
    return out


def scan(args) -> dict:
    from cocos.openmp import configure

    policy = configure("count")  # what `cocos count` would choose now; inherited by the children
    items = [FLOOR, *families()]
    sizes = sorted(int(s) for s in args.sizes.split(","))
    print(f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, OpenMP "
          f"{' '.join(f'{k}={v}' for k, v in policy.items()) or 'default'}; pair batches, d = {args.dim}, float32, "
          "both directions; peak: the process's RSS high-water mark during the item's first count", flush=True)
    print(f"{'B':>6} {'item':>10} {'blocks':>6} {'best s':>8} {'ns/pair':>8} {'x floor':>8} {'peak MB':>8} "
          f"{'growth':>7} {'load':>5}", flush=True)
    rows = []
    for n in sizes:
        repeats = args.repeats if args.repeats else max(1, min(3, (2048 * 2048 * 3) // (n * n)))
        start = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--child", ",".join(items), "--sizes", str(n), "--dim",
                               str(args.dim), "--repeats", str(repeats)], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"size {n}: {done.stderr.strip()}")
        process_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child so far
        for r in json.loads(done.stdout.strip().splitlines()[-1]):
            r["process_wall_s"] = time.perf_counter() - start
            rows.append(r)
            ratio = f"{r['ratio_to_floor']:8.2f}" if "ratio_to_floor" in r else f"{'':>8}"
            print(f"{n:6d} {r['item']:>10} {'yes' if r['blocked'] else 'no':>6} {r['best_s']:8.3f} "
                  f"{r['ns_per_pair']:8.1f} {ratio} {r['peak_mb']:8.0f} {r['growth_mb']:7.0f} "
                  f"{r['load_average']:5.1f}", flush=True)
        print(f"{n:6d} whole process: peak RSS {process_peak:.0f} MB (getrusage of the children, the largest so far)",
              flush=True)
        rows[-1]["children_peak_mb"] = process_peak
    summary = {}
    for item in items:
        per = {r["size"]: r["ns_per_pair"] for r in rows if r["item"] == item}
        ratios = {r["size"]: r["ratio_to_floor"] for r in rows if r["item"] == item and "ratio_to_floor" in r}
        summary[item] = {"ns_per_pair": per, "largest_over_smallest": per[max(per)] / per[min(per)],
                         "ratio_to_floor": ratios, "peak_mb": {r["size"]: r["peak_mb"] for r in rows
                                                               if r["item"] == item}}
    return {"benchmark": "big_batch", "mode": "cpu scan", "machine": {**machine("cpu"), "torch_threads":
                                                                      rows[0]["torch_threads"]}, **commit(),
            "settings": {"sizes": sizes, "dim": args.dim, "dtype": "float32", "layout": "pair",
                         "budget": "library default (256 MB)", "floor": f"(I @ C.T > {THRESHOLD}).sum(-1)",
                         "openmp_policy": policy, "peak": "RSS high-water mark (VmHWM / ru_maxrss, reset before each "
                         "item) during the item's first count, in a fresh process per size"},
            "results": rows, "summary": summary, "max_peak_mb": max(r["peak_mb"] for r in rows),
            "load_average_end": [round(x, 2) for x in os.getloadavg()]}


# ---------------------------------------------------------------------- device: one process, counts against the floor


def timed(fn, device) -> tuple[float, float]:
    """Seconds of ``fn()`` (the device synchronised around it) and its peak memory in MB above what was allocated
    before: CUDA's allocator statistics, else the RSS high-water mark (reset first where Linux allows)."""
    import torch

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    else:
        reset_high_water()
        before = status_mb().get("VmRSS", maxrss_mb()) * 2**20
    start = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) if cuda else maxrss_mb() * 2**20
    return seconds, (peak - before) / 2**20


def budget_bytes(text: str | None, device) -> int | None:
    """``--budget``: None for the library's default, a quarter of the free device memory for ``auto`` on CUDA."""
    import torch

    if text in (None, "default") or (text == "auto" and device.type != "cuda"):
        return None
    if text == "auto":
        return torch.cuda.mem_get_info(device)[0] // 4
    return int(float(text))


def device_run(args) -> dict:
    import torch

    from cocos.counting import count_queries
    from cocos.counting.blocks import count_batch_values

    device = torch.device(args.device)
    cuda = device.type == "cuda"

    items = families()
    budget = budget_bytes(args.budget, device)
    print(f"device {device}{' (' + torch.cuda.get_device_name(device) + ')' if cuda else ''}, torch "
          f"{torch.__version__}, d = {args.dim}, budget {budget if budget is not None else 'default'}", flush=True)
    warm_i, warm_c = embeddings(WARM, args.dim, device, seed=1)
    for item in [FLOOR, *items]:
        run_item(item, warm_i, warm_c, budget)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for n in sizes:
        images, captions = embeddings(n, args.dim, device)
        floor_t, floor_peak = zip(*(timed(lambda x=images, y=captions: floor(x, y), device)
                                    for _ in range(args.repeats)), strict=True)
        best_floor = min(floor_t)
        print(f"{n} x {n}: floor {best_floor * 1e3:.2f} ms (peak +{max(floor_peak):.0f} MB)", flush=True)
        rows.append({"item": FLOOR, "size": n, "seconds": list(floor_t), "best_s": best_floor,
                     "ns_per_pair": best_floor / n / n * 1e9, "peak_mb": max(floor_peak)})
        for item in items:
            t, peak = zip(*(timed(lambda item=item, x=images, y=captions: run_item(item, x, y, budget), device)
                            for _ in range(args.repeats)), strict=True)
            best = min(t)
            rows.append({"item": item, "size": n, "blocked": blocked(item, n, budget), "seconds": list(t),
                         "best_s": best, "ns_per_pair": best / n / n * 1e9, "peak_mb": max(peak),
                         "ratio_to_floor": best / best_floor})
            print(f"{n} x {n}: {item:>10} {best * 1e3:9.2f} ms  {best / best_floor:6.2f} x floor  peak +"
                  f"{max(peak):.0f} MB", flush=True)
        del images, captions
    check = {}
    if args.check_size:
        images, captions = embeddings(args.check_size, args.dim, device)
        for item in items:  # blocked (a small budget: many blocks) against the whole count on this device
            whole = count_queries(images, captions, item)
            got = count_batch_values(images, captions, item, budget=64 * args.check_size * 64)
            diffs = {}
            for d in ("i2t", "t2i"):
                for k, want in whole[d].batch.items():
                    a, b = got[d][k].double().cpu(), want.double().cpu()
                    diffs[f"{d}/{k}"] = 0.0 if torch.equal(a, b) or bool(a.isnan() & b.isnan()) else float(
                        (a - b).abs() / b.abs().clamp(min=1e-300))
            check[item] = diffs
            print(f"blocked vs whole at {args.check_size}: {item:>10} largest relative difference "
                  f"{max(diffs.values()):.2e}", flush=True)
    return {"benchmark": "big_batch", "mode": "device", "machine": machine(str(device)), **commit(),
            "settings": {"sizes": sizes, "dim": args.dim, "dtype": "float32", "layout": "pair", "repeats":
                         args.repeats, "budget": budget, "floor": f"(I @ C.T > {THRESHOLD}).sum(-1)",
                         "check_size": args.check_size, "target": "counting <= 2 x floor"},
            "results": rows, "blocked_vs_whole_relative_difference": check}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=None, help="batch sizes B (pairs B x B); default 1024,2048,4096,8192 on "
                        "the CPU scan, 32768 on CUDA")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per item (default: CPU scan 3 at "
                        "B <= 2048, then fewer; device 3)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--inprocess", action="store_true", help="the device path (one process) on the CPU")
    parser.add_argument("--budget", default=None, help="block budget in bytes, 'default' or 'auto' (device path)")
    parser.add_argument("--check-size", type=int, default=4096, help="device path: blocked against whole at this "
                        "size (0: skip)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child.split(","), int(args.sizes), args.dim, args.repeats)))
        return
    device_path = args.inprocess or args.device != "cpu"
    if args.sizes is None:
        args.sizes = "32768" if device_path else "1024,2048,4096,8192"
    if device_path:
        args.repeats = args.repeats or 3
        res = device_run(args)
        default_out = RESULTS / f"big_batch_{res['machine']['device'].split(':')[0]}.json"
    else:
        res = scan(args)
        default_out = RESULTS / "big_batch_cpu.json"
    out = Path(args.out) if args.out else default_out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
