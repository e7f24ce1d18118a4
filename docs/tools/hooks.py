"""MkDocs hook: include the DAG's result files into pages (``hooks:`` in mkdocs.yml).

A page includes a file of ``docs/`` (a table the DAG wrote into ``docs/results/``) with one line:

    <!-- include: results/celeba-sample.md -->      the file must exist (the build fails if not)
    <!-- include?: results/femnist-sample.md -->    optional: a note stands in until it exists

(each alone on its line, outside code blocks).

A page lists the modules of the built-in methods, in the registry's order, with one line:

    <!-- registry-modules -->        one ``::: mcfl.algorithms.<module>`` (mkdocstrings) per module

so that adding a method to ``mcfl.algorithms.REGISTRY`` adds it to the API reference.
The file's headings are demoted by one level (``shift=N`` after the path changes that), and its
relative links and images are rewritten relative to the including page, so a results file written
for ``docs/results/`` (linking ``femnist-sample.png`` beside it) renders correctly anywhere. The
included text is read at build time: when ``make docs-results`` or another DAG step rewrites a
results file, the next ``make docs`` shows it; nothing is retyped.
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

INCLUDE = re.compile(r"^<!--\s*include(?P<opt>\?)?:\s*(?P<path>\S+)(?:\s+shift=(?P<shift>\d+))?\s*-->\s*$")
LINK = re.compile(r"(?P<pre>!?\[[^\]]*\]\()(?P<url>[^)\s]+)(?P<post>[^)]*\))")
HEADING = re.compile(r"^(#{1,6})(\s)")
FENCE = re.compile(r"^\s*(```|~~~)")
REGISTRY_MODULES = re.compile(r"^<!--\s*registry-modules\s*-->\s*$")


def registry_modules() -> list[str]:
    """The modules of the built-in methods (``mcfl.algorithms.REGISTRY``), each once, in its order."""
    from mcfl.algorithms import REGISTRY

    return list(dict.fromkeys(f"mcfl.algorithms.{spec.split(':')[0]}" for spec in REGISTRY.values()))


def _rebase(url: str, src_dir: str, page_dir: str) -> str:
    if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", url, re.I):
        return url
    target = posixpath.normpath(posixpath.join(src_dir, url))
    return posixpath.relpath(target, page_dir or ".")


def _render(text: str, src_dir: str, page_dir: str, shift: int) -> str:
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if not fenced:
            if line.startswith("<!--") and line.rstrip().endswith("-->"):
                continue  # generator comments
            if shift:
                line = HEADING.sub(lambda m: "#" * min(6, len(m.group(1)) + shift) + m.group(2), line)
            line = LINK.sub(lambda m: m.group("pre") + _rebase(m.group("url"), src_dir, page_dir)
                            + m.group("post"), line)
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files, **kwargs):
    docs_dir = Path(config["docs_dir"])
    page_dir = posixpath.dirname(page.file.src_uri)
    lines, fenced = [], False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if not fenced and REGISTRY_MODULES.match(line):
            lines += [f"::: {module}\n" for module in registry_modules()]
            continue
        m = None if fenced else INCLUDE.match(line)
        if not m:
            lines.append(line)
            continue
        rel = m.group("path")
        path = docs_dir / rel
        if not path.is_file():
            if m.group("opt"):
                lines += ["!!! note \"Not generated yet\"",
                          f"    `docs/{rel}` does not exist yet: the DAG step that writes it has not been run here."]
                continue
            raise PluginError(f"{page.file.src_uri}: included file docs/{rel} not found")
        shift = int(m.group("shift") or 1)
        lines.append(_render(path.read_text(), posixpath.dirname(rel), page_dir, shift))
    return "\n".join(lines)
