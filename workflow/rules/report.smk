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
        runs=lambda w, input: " ".join(os.path.dirname(f) for f in input),
        sources=" ".join(f"{d}={ds['prepare']['source']}" for d, ds in config["datasets"].items()),
    shell:
        "mcfl report --out {RES} {params.runs} --sources {params.sources} > {log} 2>&1"
