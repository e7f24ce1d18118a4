# Tables and figures from the runs' own output files.


rule report:
    input:
        [d + "/metrics.json" for d in run_dirs()],
    output:
        table=report(RES + "/table.csv", caption="../report/table.rst", category="Tables"),
        markdown=RES + "/table.md",
        paper=RES + "/paper_comparison.md",
        paper_csv=RES + "/paper_comparison.csv",
        figures=report(
            expand(RES + "/figures/convergence_{dataset}.png", dataset=list(config["datasets"])),
            caption="../report/convergence.rst",
            category="Figures",
        ),
    log:
        LOGS + "/report.log",
    benchmark:
        RES + "/benchmarks/report.tsv"
    params:
        runs=lambda w, input: [os.path.dirname(f) for f in input],
        sources=[f"{d}={ds['prepare']['source']}" for d, ds in config["datasets"].items()],
        out=RES,
    shell:
        "mcfl report --out {params.out:q} {params.runs:q} --sources {params.sources:q} > {log:q} 2>&1"
