"""Open the built documentation site as a reader would (``make docs-check``).

Serves the built site (``site/``) on 127.0.0.1 and opens every page in headless Chromium through
Playwright, using the system's Chromium (``/usr/bin/chromium`` from Debian's packages, or
``$CHROMIUM``), so no browser is downloaded. For every page it checks that

* the page loads (HTTP 200) with a title and no JavaScript error;
* every ``<img>`` has loaded and has a non-zero natural size (the figure renders);
* every link and resource to the site itself resolves (HTTP 200), and every ``#anchor`` it points
  to exists on the target page.

Links to other hosts are listed but not fetched (the check runs offline). Exit status 1 with one
line per problem, 0 with a summary line otherwise.

Usage: ``python docs/tools/docs_check.py site``
"""
from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import sys
import threading
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse


def find_chromium() -> str | None:
    for c in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
              shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if c and Path(c).exists():
            return c
    return None


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # the browser cancels requests when it moves to the next page


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(QuietHandler, directory=str(root))
    server = QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def check(site: Path, chromium: str) -> tuple[list[str], dict[str, int]]:
    from playwright.sync_api import sync_playwright

    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                   if p.name != "404.html")
    server, base = serve(site)
    problems: list[str] = []
    stats = {"pages": 0, "images": 0, "links": 0, "anchors": 0, "external": 0}
    anchors: dict[str, set[str]] = {}
    status: dict[str, int] = {}
    to_check: list[tuple[str, str]] = []  # (page, absolute url with fragment)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                         args=["--no-sandbox", "--disable-gpu"])
            ctx = browser.new_context()
            # The check is offline: anything not on the local server is answered empty.
            ctx.route("**/*", lambda route: route.continue_()
                      if route.request.url.startswith(base) else route.abort())
            page = ctx.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            for rel in pages:
                errors.clear()
                url = urljoin(base, rel)
                resp = page.goto(url, wait_until="load")
                stats["pages"] += 1
                if resp is None or resp.status != 200:
                    problems.append(f"{rel}: HTTP {resp.status if resp else 'no response'}")
                    continue
                if not page.title():
                    problems.append(f"{rel}: no <title>")
                info = page.evaluate("""() => ({
                    ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
                    imgs: Array.from(document.images).map(i => ({src: i.currentSrc || i.src,
                        ok: i.complete && i.naturalWidth > 0, w: i.naturalWidth})),
                    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
                    res: Array.from(document.querySelectorAll('link[href], script[src]'))
                        .map(e => e.href || e.src),
                })""")
                anchors[url] = set(info["ids"])
                for img in info["imgs"]:
                    stats["images"] += 1
                    if not img["ok"]:
                        problems.append(f"{rel}: image does not render: {img['src']}")
                for link in info["links"] + info["res"]:
                    if not link.startswith(("http://", "https://")):
                        continue  # mailto:, javascript:
                    if not link.startswith(base):
                        stats["external"] += 1
                        continue
                    to_check.append((rel, link))
                for e in errors:
                    problems.append(f"{rel}: JavaScript error: {e}")
            browser.close()
        # Links and resources on the site: the target must exist, and so must the anchor.
        import urllib.error
        import urllib.request
        for rel, link in to_check:
            target, frag = urldefrag(link)
            if target.endswith("/"):
                target += "index.html"
            if target not in status:
                try:
                    with urllib.request.urlopen(target) as r:
                        status[target] = r.status
                except urllib.error.HTTPError as e:
                    status[target] = e.code
                stats["links"] += 1
            if status[target] != 200:
                problems.append(f"{rel}: broken link {urlparse(link).path} (HTTP {status[target]})")
                continue
            if frag and target in anchors:
                stats["anchors"] += 1
                if frag not in anchors[target]:
                    problems.append(f"{rel}: link to a missing anchor {urlparse(link).path}#{frag}")
    finally:
        server.shutdown()
    return sorted(set(problems)), stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", type=Path, help="the built site (mkdocs build --site-dir)")
    a = ap.parse_args()
    if not (a.site / "index.html").exists():
        print(f"{a.site}/index.html not found: run `make docs` first", file=sys.stderr)
        return 2
    chromium = find_chromium()
    if chromium is None:
        print("no Chromium found: `apt-get install chromium` (or set CHROMIUM=/path/to/chrome)",
              file=sys.stderr)
        return 2
    problems, s = check(a.site.resolve(), chromium)
    for p in problems:
        print(p)
    print(f"docs-check: {s['pages']} pages loaded, {s['images']} images checked, "
          f"{s['links']} distinct site links and resources resolved, {s['anchors']} anchors checked, "
          f"{s['external']} external links not fetched; {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
