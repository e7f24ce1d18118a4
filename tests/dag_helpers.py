"""Helpers of the tests that run the Snakemake DAG: a run in a scratch directory, a dry run's job
counts, a config written where the Snakefile reads it, and the tables Snakemake's report shows."""

import subprocess

import pytest
import yaml

from conftest import ROOT
from test_mlflow_ui import CHROMIUM


def snakemake(workdir, env, *args):
    cmd = ["snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir), "--cores", "2",
           *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def job_counts(stdout):
    """{rule: count} from a dry run's job-stats table."""
    counts, on = {}, False
    for line in stdout.splitlines():
        if line.startswith("job ") and "count" in line:
            on = True
            continue
        if on:
            parts = line.split()
            if parts and parts[0] == "total":
                break
            if len(parts) == 2 and parts[1].isdigit() and parts[0].isidentifier():
                counts[parts[0]] = int(parts[1])
    return counts


def write_config(workdir, cfg):
    (workdir / "config").mkdir(exist_ok=True)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))



def tables_shown(report, category: str, result: str) -> int:
    """Open Snakemake's ``report`` in headless Chromium (Playwright) as a reader does: the category,
    then the eye of ``result``; the number of tables the page shown inline holds."""
    sync_playwright = pytest.importorskip("playwright.sync_api", reason="the [docs] extra is not installed").sync_playwright
    if CHROMIUM is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(report.as_uri())
            page.get_by_text(category, exact=True).first.click()
            row = page.locator("tr", has_text=result).first
            row.locator('a[iconname="eye"]').click()
            page.wait_for_timeout(1500)
            shown = [f for f in page.frames if f.url.startswith("data:text/html")]
            return sum(f.locator("table").count() for f in shown)
        finally:
            browser.close()
