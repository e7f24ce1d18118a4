"""The report's tables as web pages: Snakemake's report shows HTML inline (a CSV only as a link)."""

import re

from conftest import ROOT
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


def test_the_report_rule_registers_the_html_tables_not_the_csv():
    text = (ROOT / "workflow" / "rules" / "report.smk").read_text()
    registered = re.findall(r'report\(\s*P\.res\("([^"]+)"\)', text)
    assert "table.html" in registered and "paper_comparison.html" in registered
    assert not [f for f in registered if f.endswith(".csv")]
