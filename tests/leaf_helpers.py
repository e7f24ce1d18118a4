"""Test inputs for the LEAF sources: small archives in the exact NIST SD19 and CelebA layouts
(with the decoys LEAF ignores), and a localhost HTTP server that honours Range and injects faults."""

from __future__ import annotations

import hashlib
import io
import re
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CELEBA_ATTRS = ("5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips "
                "Big_Nose Black_Hair Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin "
                "Eyeglasses Goatee Gray_Hair Heavy_Makeup High_Cheekbones Male Mouth_Slightly_Open "
                "Mustache Narrow_Eyes No_Beard Oval_Face Pale_Skin Pointy_Nose Receding_Hairline "
                "Rosy_Cheeks Sideburns Smiling Straight_Hair Wavy_Hair Wearing_Earrings Wearing_Hat "
                "Wearing_Lipstick Wearing_Necklace Wearing_Necktie Young").split()
HEX_CLASSES = [f"{c:x}" for c in [*range(0x30, 0x3a), *range(0x41, 0x5b), *range(0x61, 0x7b)]]


def glyph(rng: np.random.Generator, mode: str = "RGB") -> bytes:
    """A 128x128 NIST-like PNG: black strokes on white (mode RGB or 1-bit)."""
    im = Image.new("RGB", (128, 128), (255, 255, 255))
    d = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(1, 4))):
        pts = [tuple(int(v) for v in rng.integers(16, 112, 2)) for _ in range(int(rng.integers(2, 5)))]
        d.line(pts, fill=(0, 0, 0), width=int(rng.integers(3, 10)))
    if mode == "1":
        im = im.convert("1")
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


@dataclass
class Nist:
    """A NIST-layout pair of zips plus what the images are (writer -> [(member, hex class)])."""
    by_class: Path
    by_write: Path
    writers: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def md5(self) -> list[str]:
        return [f"{p.name}={hashlib.md5(p.read_bytes()).hexdigest()}" for p in (self.by_class, self.by_write)]


def make_nist(folder: Path, n_writers: int = 7, seed: int = 0, sizes=(3, 14)) -> Nist:
    """by_class.zip / by_write.zip as NIST SD19 lays them out:

    by_class/<hex>/hsf_<p>/hsf_<p>_<nnnnn>.png, the same images again under by_class/<hex>/train_<hex>/
    (LEAF ignores them), and <hex>/hsf_<p>.mit, <hex>/train_<hex>.mit text files (ignored too);
    by_write/hsf_<p>/f<wwww>_<tt>/<type><wwww>_<tt>/<type><wwww>_<tt>_<nnnnn>.png.
    One image is duplicated under two classes (the first in path order, '30', must win) and writers
    are written in a scrambled order (the listing order must not matter)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    cls_entries, write_entries = [], []
    writers: dict[str, list[tuple[str, str]]] = {}
    counter: dict[tuple[str, int], int] = {}
    for w in rng.permutation(n_writers):
        p = int(w) % 3 * 2                                    # partitions hsf_0, hsf_2, hsf_4
        writer = f"f{int(w):04d}_{int(w) * 7 % 50:02d}"
        n = int(rng.integers(*sizes))
        writers[writer] = []
        for j in range(n):
            hexc = str(rng.choice(HEX_CLASSES[:12])) if j % 3 else str(rng.choice(HEX_CLASSES))
            kind = "d" if hexc < "3a" else ("u" if hexc < "5b" else "l")
            png = glyph(rng, "1" if j % 4 == 0 else "RGB")
            t = f"{kind}{writer[1:]}"
            member = f"by_write/hsf_{p}/{writer}/{t}/{t}_{j:05d}.png"
            write_entries.append((member, png))
            writers[writer].append((member, hexc))
            k = counter.setdefault((hexc, p), 0)
            counter[hexc, p] += 1
            cls_entries.append((f"by_class/{hexc}/hsf_{p}/hsf_{p}_{k:05d}.png", png))
            cls_entries.append((f"by_class/{hexc}/train_{hexc}/train_{hexc}_{len(cls_entries):05d}.png", png))
    # the first by_write image of the first writer also sits under class '4f' in hsf_7: '30' < '4f'
    first_writer = sorted(writers, key=lambda w: (writers[w][0][0]))[0]
    member, hexc = writers[first_writer][0]
    png = dict(write_entries)[member]
    cls_entries.append(("by_class/30/hsf_7/hsf_7_00000.png", png))
    cls_entries.append(("by_class/4f/hsf_7/hsf_7_00000.png", png))
    writers[first_writer][0] = (member, "30")
    for hexc in {e.split("/")[1] for e, _ in cls_entries}:
        cls_entries.append((f"by_class/{hexc}/hsf_0.mit", b"hsf_0 mit listing\n"))
        cls_entries.append((f"by_class/{hexc}/train_{hexc}.mit", b"train mit listing\n"))
    order = rng.permutation(len(cls_entries))
    bc, bw = folder / "by_class.zip", folder / "by_write.zip"
    with zipfile.ZipFile(bc, "w", zipfile.ZIP_DEFLATED) as z:
        for i in order:
            z.writestr(*cls_entries[i])
    with zipfile.ZipFile(bw, "w", zipfile.ZIP_DEFLATED) as z:
        for i in rng.permutation(len(write_entries)):
            z.writestr(*write_entries[i])
    return Nist(bc, bw, writers)


def make_celeba(folder: Path, n_celebs: int = 9, seed: int = 0, as_dir: bool = False) -> dict:
    """img_align_celeba.zip (or folder), identity_CelebA.txt and list_attr_celeba.txt in CelebA's
    formats; some celebrities have fewer than 5 images. Returns {image: (celeb, smiling)}."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    counts = [int(rng.integers(2, 12)) for _ in range(n_celebs)]
    owners = rng.permutation(np.repeat(np.arange(n_celebs), counts))
    truth, ident, attrs, files = {}, [], [], []
    for i, c in enumerate(owners, 1):
        name = f"{i:06d}.jpg"
        arr = (rng.random((218, 178, 3)) * 64 + rng.integers(0, 192, 3)).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, "JPEG", quality=90)
        files.append((name, buf.getvalue()))
        vals = rng.choice([-1, 1], len(CELEBA_ATTRS))
        truth[name] = (str(1000 + int(c)), int(vals[CELEBA_ATTRS.index("Smiling")] == 1))
        ident.append(f"{name} {1000 + int(c)}")
        attrs.append(name + "".join(f" {v:2d}" for v in vals))
    (folder / "identity_CelebA.txt").write_text("\n".join(ident) + "\n")
    (folder / "list_attr_celeba.txt").write_text(f"{len(attrs)}\n{' '.join(CELEBA_ATTRS)} \n"
                                                 + "\n".join(attrs) + "\n")
    if as_dir:
        (folder / "img_align_celeba").mkdir()
        for name, data in files:
            (folder / "img_align_celeba" / name).write_bytes(data)
    else:
        with zipfile.ZipFile(folder / "img_align_celeba.zip", "w") as z:
            for name, data in files:
                z.writestr(f"img_align_celeba/{name}", data)
    return truth


def md5_args(folder: Path, names) -> list[str]:
    return [f"{n}={hashlib.md5((folder / n).read_bytes()).hexdigest()}" for n in names]


class RangeServer:
    """Serves ``root`` on localhost with HTTP Range support. Faults: ``truncate[name] = k`` sends
    only k bytes of the next full response for that file (then closes), ``status[name] = code``
    answers that status. ``requests`` logs (path, Range header)."""

    def __init__(self, root: Path):
        self.root, self.truncate, self.status, self.requests = Path(root), {}, {}, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip("/").split("/")[-1]
                rng = self.headers.get("Range")
                server.requests.append((self.path, rng))
                if name in server.status:
                    self.send_error(server.status[name])
                    return
                f = server.root / name
                if not f.is_file():
                    self.send_error(404)
                    return
                data = f.read_bytes()
                start = 0
                m = re.fullmatch(r"bytes=(\d+)-", rng or "")
                if m:
                    start = int(m.group(1))
                    if start >= len(data):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                cut = server.truncate.pop(name, None)
                self.wfile.write(body if cut is None else body[:cut])
                if cut is not None:
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/sd19"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
