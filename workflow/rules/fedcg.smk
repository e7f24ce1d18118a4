# FedCG's tables (Caldarola et al. 2021, Tables 3-5) from the FedAvg and FedCG runs of every dataset
# that has a FedCG run, and per dataset what its discovered domains follow (each client's domain
# shares against per-writer image statistics). Nothing is added when the config has no FedCG entry.

if P.fedcg.table_runs():

    rule fedcg_tables:
        input:
            [f"{d}/metrics.json" for d in P.fedcg.table_runs()],
            [f"{d}/predictions.csv" for d in P.fedcg.table_runs()],  # Table 5's image-by-image comparison
        output:
            table3=P.res("fedcg/table3.csv"),
            table4=P.res("fedcg/table4.csv"),
            table5=P.res("fedcg/table5.csv"),
            markdown=P.res("fedcg/tables.md"),
            # Snakemake's report shows HTML inline (a CSV only as a download): the three tables as a page
            html=report(P.res("fedcg/tables.html"), caption="../report/fedcg_tables.rst", category="FedCG"),
        log:
            P.logs("fedcg_tables.log"),
        params:
            runs=P.fedcg.table_runs(),
            out=lambda w: P.res("fedcg"),
        shell:
            "mcfl report-fedcg --out {params.out:q} {params.runs:q} > {log:q} 2>&1"


if P.fedcg.domain_datasets():

    rule fedcg_writers:
        input:
            store=lambda w: P.store(w.dataset),
            assignments=lambda w: [f"{d}/assignments.csv" for d in P.fedcg.domain_runs(w.dataset)],
        output:
            csv=P.res("fedcg/{dataset}/writers.csv"),
            shares=P.res("fedcg/{dataset}/writers-shares.csv"),
            markdown=P.res("fedcg/{dataset}/writers.md"),
        log:
            P.logs("fedcg_writers_{dataset}.log"),
        wildcard_constraints:
            dataset="[^/]+",
        params:
            runs=lambda w: P.fedcg.domain_runs(w.dataset),
            out=lambda w: P.res(f"fedcg/{w.dataset}/writers"),
        shell:
            "mcfl report-writers --shares --store {input.store:q} --out {params.out:q} {params.runs:q} > {log:q} 2>&1"
