# Tables and figures from the runs' own output files.


rule report:
    input:
        [d + "/metrics.json" for d in run_dirs()],
    output:
        table=report(RES + "/table.csv", caption="../report/table.rst", category="Tables"),
        markdown=RES + "/table.md",
        figures=report(
            expand(RES + "/figures/convergence_{dataset}.png", dataset=list(config["datasets"])),
            caption="../report/convergence.rst",
            category="Figures",
        ),
    log:
        "logs/report.log",
    benchmark:
        RES + "/benchmarks/report.tsv"
    params:
        runs=lambda w, input: " ".join(os.path.dirname(f) for f in input),
    shell:
        "mcfl report --out {RES} {params.runs} > {log} 2>&1"
