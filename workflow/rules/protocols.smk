# FeSEM's Table 2 under the paper's, the authors' code's and the standard protocol, beside the
# paper, from every run of this config; the paper-protocol and authors' code configs' finished
# runs fill their columns. And what FeSEM's clusters of writers group by (per-writer image
# statistics). Nothing is added without `protocols`.
# Written inside the results directory (<results>/docs/...); `make docs-results` copies them into docs/.

if P.publishing.protocols:

    rule protocols_table:
        input:
            P.run_outputs("metrics.json"),
            P.run_outputs("predictions.csv"),
        output:
            csv=P.publishing.protocols["out"] + ".csv",
            markdown=P.publishing.protocols["out"] + ".md",
        log:
            P.logs("protocols_table.log"),
        params:
            runs=P.run_dirs(),
            out=lambda w: P.publishing.protocols["out"],
            reference=P.publishing.protocols["reference"],
            # optional: left out when absent (`:q` renders an empty string as nothing)
            paper=P.publishing.option("--paper-results", P.publishing.protocols["paper_results"]),
            authors=P.publishing.option("--authors-results", P.publishing.protocols["authors_results"]),
            title=P.publishing.option("--title", P.publishing.protocols["title"]),
        shell:
            "mcfl report-protocols --out {params.out:q} --reference {params.reference:q} "
            "{params.paper:q} {params.authors:q} {params.title:q} {params.runs:q} > {log:q} 2>&1"


if P.publishing.protocols and P.publishing.clustered_runs():

    rule writer_clusters:
        input:
            store=P.publishing.clustered_store(),
            assignments=[f"{d}/assignments.csv" for d in P.publishing.clustered_runs()],
        output:
            csv=P.publishing.protocols["out"] + "-clusters.csv",
            markdown=P.publishing.protocols["out"] + "-clusters.md",
        log:
            P.logs("writer_clusters.log"),
        params:
            runs=P.publishing.clustered_runs(),
            out=lambda w: P.publishing.protocols["out"] + "-clusters",
        shell:
            "mcfl report-writers --store {input.store:q} --out {params.out:q} {params.runs:q} > {log:q} 2>&1"
