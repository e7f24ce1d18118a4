"""The MLflow UI as a reader meets it, in a real browser (Debian's Chromium, driven by playwright).

    python tests/slurm/mlflow_ui.py http://127.0.0.1:5000 EXPERIMENT OUT_DIR

Opens the experiment's runs table ("Model training"), expands the sweep run, shows the columns
dataset, method, K, seed and the four metrics, checks they are there with a value for every training
run, and screenshots it (OUT_DIR/mlflow-runs.png); then selects two runs, compares them and
screenshots the comparison (OUT_DIR/mlflow-compare.png). Also screenshots what the bare experiment
link opens on (OUT_DIR/mlflow-experiment-link.png). Used by tests/test_slurm.py.

MLflow 3.17's UI decides between its GenAI overview and the runs table by the sidebar's
GenAI / Model training switch (remembered by the browser, or `?workflowType=machine_learning` in the
link), not by the experiment's `mlflow.experimentKind` tag (which mcfl sets anyway, for UIs that read
it): links to mcfl's experiments therefore carry the parameter.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

COLUMNS = {"Tags": ["dataset", "method", "K", "seed"],
           "Metrics": ["micro_acc", "macro_acc", "micro_f1", "macro_f1"]}


def runs_url(uri: str, experiment_id: str) -> str:
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def check_ui(uri: str, experiment: str, chromium: str, out: Path, n_runs: int = 8) -> list[Path]:
    """Check the runs table and the comparison of two runs (digits FedAvg and FeSEM(2), seed 0);
    return the screenshots' paths."""
    from mlflow import MlflowClient
    from playwright.sync_api import expect, sync_playwright

    out = Path(out)
    exp = MlflowClient(uri).get_experiment_by_name(experiment)
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development", exp.tags
    shots = [out / "mlflow-experiment-link.png", out / "mlflow-runs.png", out / "mlflow-compare.png"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 2800, "height": 1100})
        page.set_default_timeout(120_000)         # a loaded 2-core machine renders slowly
        # the bare experiment link (what `mlflow` prints after a run); not "networkidle": the app polls
        page.goto(f"{uri}/#/experiments/{exp.experiment_id}")
        expect(page.get_by_text(experiment).first).to_be_visible()
        page.wait_for_timeout(3000)
        page.screenshot(path=str(shots[0]))

        page.goto(runs_url(uri, exp.experiment_id))
        page.reload()
        expect(page.get_by_text("matching runs")).to_be_visible(timeout=120_000)
        columns = page.get_by_role("button", name="Columns", exact=True)
        search = page.get_by_placeholder("Search columns")
        for group, names in COLUMNS.items():
            for name in names:
                for attempt in range(4):     # the menu may close when the table re-renders: reopen
                    try:
                        if not search.is_visible():
                            columns.click()
                        search.fill(name, timeout=10_000)
                        page.wait_for_timeout(500)
                        title = page.locator("[class*=tree-title]",
                                             has_text=re.compile(rf"^{re.escape(name)}$"))
                        node = page.locator("[class*=tree-treenode]").filter(has=title).last
                        node.locator("[class*=tree-checkbox]").first.click(timeout=10_000)
                        break
                    except Exception:  # noqa: BLE001 - playwright timeouts; retried
                        if attempt == 3:
                            page.screenshot(path=str(out / "mlflow-columns-failed.png"))
                            raise
        page.keyboard.press("Escape")
        # the training runs are nested under the sweep's run: expand it
        page.locator(".ag-row button[class*=btn-icon-only]").first.click()
        page.wait_for_timeout(1500)
        header = page.locator(".ag-header").inner_text()
        for names in COLUMNS.values():
            for name in names:
                assert re.search(rf"(^|\s){re.escape(name)}(\s|$)", header), (name, header)
        rows = page.locator(".ag-center-cols-container .ag-row")
        assert rows.count() >= n_runs + 1, rows.count()
        body = page.locator(".ag-center-cols-container").inner_text()
        assert len(re.findall(r"\b0\.\d{2,}", body)) >= 4 * n_runs, body[:2000]
        page.screenshot(path=str(shots[1]), full_page=True)

        # compare two training runs
        pair = ["digits/FedAvg/seed0", "digits/FeSEM(2)/seed0"]
        for name in pair:
            i = page.locator(".ag-row", has_text=name).first.get_attribute("row-index")
            page.locator(f".ag-row[row-index='{i}'] .ag-checkbox-input-wrapper").first.click()
        page.get_by_role("button", name=re.compile("^Compare")).click()
        expect(page.get_by_text(re.compile(r"Comparing 2 [Rr]uns"))).to_be_visible(timeout=120_000)
        page.wait_for_timeout(1500)
        text = page.inner_text("body")
        for k in ["micro_acc", "dataset", "seed", *pair]:
            assert k in text, k
        page.screenshot(path=str(shots[2]), full_page=True)
        browser.close()
    return shots


if __name__ == "__main__":
    import shutil

    uri, experiment, out = sys.argv[1:4]
    Path(out).mkdir(parents=True, exist_ok=True)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    print("\n".join(map(str, check_ui(uri, experiment, chromium, Path(out)))))
