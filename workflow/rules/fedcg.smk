# FedCG's tables (Caldarola et al. 2021, Tables 3-5) from the FedAvg and FedCG runs of every dataset
# that has a FedCG run. Nothing is added when the config has no FedCG entry.

FEDCG_DATASETS = sorted({r["dataset"] for r in RUNS.values() if r["method"] == "FedCG"})
FEDCG_RUNS = [RUN_DIR.format(dataset=d, run=r, seed=s) for (d, r, s), run in RUNS.items()
              if d in FEDCG_DATASETS and run["method"] in ("FedCG", "FedAvg")]

if FEDCG_RUNS:

    rule fedcg_tables:
        input:
            [d + "/metrics.json" for d in FEDCG_RUNS],
            [d + "/predictions.csv" for d in FEDCG_RUNS],    # Table 5's image-by-image comparison
        output:
            table3=report(RES + "/fedcg/table3.csv", caption="../report/fedcg_table3.rst", category="FedCG"),
            table4=report(RES + "/fedcg/table4.csv", caption="../report/fedcg_table4.rst", category="FedCG"),
            table5=report(RES + "/fedcg/table5.csv", caption="../report/fedcg_table5.rst", category="FedCG"),
            markdown=RES + "/fedcg/tables.md",
        log:
            LOGS + "/fedcg_tables.log",
        params:
            runs=FEDCG_RUNS,
            out=RES + "/fedcg",
        shell:
            "mcfl report-fedcg --out {params.out:q} {params.runs:q} > {log:q} 2>&1"

    EXTRA_TARGETS += list(rules.fedcg_tables.output)
