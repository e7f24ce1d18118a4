"""The report's tables as web pages: Snakemake's report shows HTML inline (a CSV only as a link)."""

import re

import pytest

from conftest import ROOT
from test_mlflow_ui import CHROMIUM, chromium
from mcfl.report.format import markdown_html, markdown_table


def test_markdown_tables_become_html_tables_cell_for_cell():
    md = ("# FEMNIST <sample>\n\nOne row per method.\n\n"
          + markdown_table(["method", "micro acc"], [["FedAvg", "84.1 ± 0.3"], ["FeSEM(2)", "82.5 ± 1.0"]])
          + "\n- a note\n")
    page = markdown_html(md, "Results")
    assert page.startswith("<!DOCTYPE html>") and "<title>Results</title>" in page
    assert "<h1>FEMNIST &lt;sample&gt;</h1>" in page and "<p>One row per method.</p>" in page
    rows = re.findall(r"<tr>(.*?)</tr>", page)
    assert rows[0] == "<th>method</th><th>micro acc</th>"
    assert rows[1:] == ["<td>FedAvg</td><td>84.1 ± 0.3</td>", "<td>FeSEM(2)</td><td>82.5 ± 1.0</td>"]
    assert "---" not in page and "<li>a note</li>" in page


def test_the_report_rules_register_the_html_tables_not_the_csv():
    """Every paper's tables show inline: the default table, the paper comparison, FedCG's Tables 3-5
    and FedGSP's Table 1 are registered as web pages, no table as a CSV download."""
    from mcfl.config import read_configs, validate
    from mcfl.plan import Plan

    text = (ROOT / "workflow" / "rules" / "report.smk").read_text()
    registered = re.findall(r'report\(\s*P\.res\((?:f?"([^"]+)")\)', text)
    for overlay in ("fedcg", "fedgsp"):        # the papers' jobs (workflow/rules/papers.smk)
        configs = [ROOT / "config" / "femnist-sample.yaml", ROOT / "config" / "femnist-sample" / f"{overlay}.yaml"]
        plan = Plan(validate(read_configs([str(c) for c in configs])))
        registered += [re.sub(r"^fedgsp/[^/]+/", "", job.outputs[k].removeprefix(plan.res("")))
                       for job in plan.paper_jobs() for k in job.reports if job.rule.startswith(overlay)]
    for page in ("table.html", "paper_comparison.html", "fedcg/tables.html", "table.html"):
        assert page in registered, page
    assert registered.count("table.html") == 2                  # the default's and FedGSP's
    assert not [f for f in registered if f.endswith(".csv")]


def test_fedcg_and_fedgsp_writers_write_their_tables_as_pages():
    import inspect

    from mcfl.papers.fedcg import tables as fedcg
    from mcfl.papers.fedgsp import tables as fedgsp

    assert '"tables.html"' in inspect.getsource(fedcg.write_fedcg_report)
    assert '"table.html"' in inspect.getsource(fedgsp.write_table)


WIDE = ("# Comparison with the papers\n\n"
        + markdown_table(["dataset", "method", *(f"a long column name {i}" for i in range(14))],
                         [["femnist", "FeSEM(4)", *(f"84.1 ± 0.3 (paper 85.{i})" for i in range(14))]]))
#: written into the page by Chromium: how wide the page is, and how wide the table's box and its content
PROBE = ("<script>document.title = [document.documentElement.scrollWidth, window.innerWidth, "
         "document.querySelector('.wide').clientWidth, document.querySelector('.wide').scrollWidth].join(' ')"
         "</script>")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH (apt-get install chromium)")
def test_a_wide_table_scrolls_inside_its_box_and_the_page_fits(tmp_path):
    """The paper comparison (16 columns) in a 700-pixel window: the page is no wider than the window
    (nothing cut off on the right); the table scrolls inside its own box."""
    page = tmp_path / "wide.html"
    page.write_text(markdown_html(WIDE, "t").replace("</body>", PROBE + "</body>"))
    dom = chromium(page.as_uri(), tmp_path / "profile", "--dump-dom", size="700,600", timeout=120)
    page_w, window_w, box_w, content_w = map(int, re.search(r"<title>([\d ]+)</title>", dom).group(1).split())
    assert page_w <= window_w and box_w <= window_w
    assert content_w > box_w                                   # wider than the box: it scrolls there
