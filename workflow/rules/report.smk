# Tables and figures from the configured runs' own output files (FedGSP's sweep runs feed only its
# own figures: mcfl.plan.Plan.configured).

from mcfl.replication import ReplicationPlan


rule report:
    input:
        P.run_outputs("metrics.json"),
    output:
        # Snakemake's report shows HTML inline (a CSV only as a download): the tables as web pages
        table=P.res("table.csv"),
        html=report(P.res("table.html"), caption="../report/table.rst", category="Tables"),
        markdown=P.res("table.md"),
        paper=P.res("paper_comparison.md"),
        paper_csv=P.res("paper_comparison.csv"),
        paper_html=report(P.res("paper_comparison.html"), caption="../report/paper_comparison.rst", category="Tables"),
        figures=report(
            [P.res(f"figures/convergence_{d}.png") for d in config["datasets"]],
            caption="../report/convergence.rst",
            category="Figures",
        ),
    log:
        P.logs("report.log"),
    benchmark:
        P.res("benchmarks/report.tsv")
    params:
        runs=P.input_dirs,
        sources=[f"{d}={ds['prepare']['source']}" for d, ds in config["datasets"].items()],
        out=lambda w: RES,
        # a replicated config's original dataset: its runs name no draw (mcfl.replication)
        draw=ReplicationPlan(P).original_flag(),
    shell:
        "mcfl report --out {params.out:q} {params.runs:q} --sources {params.sources:q} {params.draw:q} > {log:q} 2>&1"
