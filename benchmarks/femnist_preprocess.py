"""FEMNIST preprocessing speed and memory, extrapolated to the full NIST SD19.

Builds by_class.zip / by_write.zip in NIST's layout with ``--images`` by_write images (writers of
~230 images, as in FEMNIST) whose by_class twins appear twice (hsf_* and the train_* decoys, as in
SD19), then runs ``mcfl prepare femnist`` on them in fresh processes and prints:

* images/s (by_write images through the whole pipeline: hash both zips, sample/split, decode,
  write the store) with 1 and with ``--workers`` decoding processes, and their ratio;
* peak memory (RSS of the main process, and of it plus its workers, sampled every 20 ms) at
  ``--images`` and half of it; the difference gives the memory per image used to extrapolate
  (workers hold a few chunks only: their memory does not grow with the data);
* the baseline LEAF-style alternative measured in the same run: extracting by_write.zip to disk
  and reading the files back, against reading the members straight from the zip;
* extrapolations to the full dataset (814,255 by_write images, ~1.63M by_class members) against
  the targets: < 15 min on 2 cores, < 4 GB.

    PYTHONPATH=src python benchmarks/femnist_preprocess.py --images 20000 --workers 2
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

FULL_BY_WRITE = 814_255
HEX = [f"{c:x}" for c in [*range(0x30, 0x3A), *range(0x41, 0x5B), *range(0x61, 0x7B)]]


def build(folder: Path, n: int, seed: int = 0) -> list[str]:
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "by_class.zip", "w", zipfile.ZIP_DEFLATED) as bc, \
            zipfile.ZipFile(folder / "by_write.zip", "w", zipfile.ZIP_DEFLATED) as bw:
        for i in range(n):
            im = Image.new("RGB", (128, 128), (255, 255, 255))
            d = ImageDraw.Draw(im)
            for _ in range(3):
                d.line([tuple(int(v) for v in rng.integers(16, 112, 2)) for _ in range(4)],
                       fill=(0, 0, 0), width=int(rng.integers(3, 10)))
            buf = io.BytesIO()
            im.save(buf, "PNG")
            png = buf.getvalue()
            w, p, h = i // 230, (i // 230) % 8, HEX[i % 62]
            writer = f"f{w:04d}_{w % 100:02d}"
            bw.writestr(f"by_write/hsf_{p}/{writer}/d{writer[1:]}/d{writer[1:]}_{i:05d}.png", png)
            bc.writestr(f"by_class/{h}/hsf_{p}/hsf_{p}_{i:06d}.png", png)
            bc.writestr(f"by_class/{h}/train_{h}/train_{h}_{i:06d}.png", png)
    import hashlib
    return [f"{z}={hashlib.md5((folder / z).read_bytes()).hexdigest()}" for z in ("by_class.zip", "by_write.zip")]


def child(args) -> None:
    """One measured run in a fresh process (the library call, as `mcfl prepare femnist` makes it)."""
    from mcfl.data import load, prepare

    t = time.perf_counter()
    out = prepare("femnist", args.out, origin=args.src, md5=args.md5, raw_dir=args.out + ".raw",
                  workers=args.workers, tf=0.8)
    wall = time.perf_counter() - t
    d = load(out)
    print(json.dumps({"wall": wall, "n": int(d.meta["n_train"] + d.meta["n_test"])}))


def measure(src: Path, md5: list[str], out: Path, workers: int) -> dict:
    """Run `child` and sample the RSS of it and its workers every 20 ms (psutil)."""
    import psutil

    cmd = [sys.executable, __file__, "--child", "--src", str(src), "--out", str(out),
           "--workers", str(workers), *[a for m in md5 for a in ("--md5", m)]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    main_proc, peak_main, peak_total = psutil.Process(proc.pid), 0, 0
    while proc.poll() is None:
        try:
            rss_main = main_proc.memory_info().rss
            rss_all = rss_main + sum(c.memory_info().rss for c in main_proc.children(recursive=True))
        except psutil.Error:
            continue
        peak_main, peak_total = max(peak_main, rss_main), max(peak_total, rss_all)
        time.sleep(0.02)
    stdout = proc.stdout.read()
    if proc.returncode:
        raise SystemExit(f"benchmark run failed: {cmd}")
    shutil.rmtree(out, ignore_errors=True)
    return dict(json.loads(stdout.strip().splitlines()[-1]), main_mb=peak_main / 2**20,
                total_mb=peak_total / 2**20)


def extract_vs_zip(zip_path: Path, scratch: Path) -> tuple[float, float]:
    t = time.perf_counter()
    with zipfile.ZipFile(zip_path) as z:
        names = [n for n in z.namelist() if n.endswith(".png")]
        for n in names:
            z.read(n)
    in_zip = time.perf_counter() - t
    t = time.perf_counter()
    with zipfile.ZipFile(zip_path) as z:
        z.extractall(scratch)
    for n in names:
        (scratch / n).read_bytes()
    extracted = time.perf_counter() - t
    return in_zip, extracted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--md5", action="append", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    tmp = Path(tempfile.mkdtemp(prefix="femnist-bench-"))
    try:
        t = time.perf_counter()
        big, half = tmp / "big", tmp / "half"
        md5_big, md5_half = build(big, args.images), build(half, args.images // 2, seed=1)
        print(f"built NIST-layout archives of {args.images} and {args.images // 2} by_write images "
              f"(by_class twice as many members) in {time.perf_counter() - t:.0f} s; "
              f"{os.cpu_count()} CPUs")
        serial = measure(big, md5_big, tmp / "s1", 1)
        par = measure(big, md5_big, tmp / "s2", args.workers)
        small = measure(half, md5_half, tmp / "s3", args.workers)
        in_zip, extracted = extract_vs_zip(big / "by_write.zip", tmp / "x")
        n = args.images
        for name, r in (("1 worker", serial), (f"{args.workers} workers", par)):
            print(f"{name:>10}: {r['wall']:6.1f} s, {n / r['wall']:7.0f} images/s, peak RSS "
                  f"{r['main_mb']:.0f} MB main process, {r['total_mb']:.0f} MB with its workers")
        print(f"speed-up of {args.workers} workers over 1: {serial['wall'] / par['wall']:.2f}x")
        print(f"reading by_write members from the zip: {in_zip:.2f} s; extracting to disk and "
              f"reading the files (LEAF's way): {extracted:.2f} s ({extracted / in_zip:.1f}x slower)")
        full_s = par["wall"] * FULL_BY_WRITE / n
        per_img = (par["main_mb"] - small["main_mb"]) / (n - n // 2)
        full_mb = par["total_mb"] + per_img * (FULL_BY_WRITE - n)
        print(f"memory per by_write image (main process, from {n // 2} vs {n}): {per_img * 1024:.2f} KB")
        print(f"full FEMNIST ({FULL_BY_WRITE:,} by_write + ~{2 * FULL_BY_WRITE:,} by_class members), "
              f"{args.workers} workers: ~{full_s / 60:.1f} min (target < 15 min), peak "
              f"~{full_mb / 1024:.2f} GB all processes (target < 4 GB)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
