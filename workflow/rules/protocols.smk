# FeSEM's Table 2 under the paper's and the standard protocol, beside the paper (issue 29), from every
# run of this config; the paper-protocol config's finished runs fill their column. Nothing is added
# when the config has no `protocols` block.

PROTOCOLS = config.get("protocols")

if PROTOCOLS:

    rule protocols_table:
        input:
            [d + "/metrics.json" for d in run_dirs()],
            [d + "/predictions.csv" for d in run_dirs()],
        output:
            csv=PROTOCOLS["out"] + ".csv",
            markdown=PROTOCOLS["out"] + ".md",
        log:
            LOGS + "/protocols_table.log",
        params:
            runs=run_dirs(),
            out=PROTOCOLS["out"],
            reference=PROTOCOLS.get("reference", "FedAvg"),
            paper=PROTOCOLS.get("paper_results", ""),
        shell:
            "mcfl report-protocols --out {params.out:q} --reference {params.reference:q} "
            "--paper-results {params.paper:q} {params.runs:q} > {log:q} 2>&1"

    EXTRA_TARGETS += list(rules.protocols_table.output)

    # What FeSEM's clusters of real writers group by (per-writer image statistics; issue 29), for the
    # clustered runs of this config: OUT-clusters.csv / .md.
    CLUSTERED = {k: r for k, r in RUNS.items() if r["method"] in ("FeSEM", "FeSEM-MA")}
    CLUSTERED_DATASETS = sorted({k[0] for k in CLUSTERED})

    if len(CLUSTERED_DATASETS) == 1:

        rule writer_clusters:
            input:
                store=store(CLUSTERED_DATASETS[0]),
                assignments=[RUN_DIR.format(dataset=d, run=r, seed=s) + "/assignments.csv"
                             for d, r, s in CLUSTERED],
            output:
                csv=PROTOCOLS["out"] + "-clusters.csv",
                markdown=PROTOCOLS["out"] + "-clusters.md",
            log:
                LOGS + "/writer_clusters.log",
            params:
                runs=[RUN_DIR.format(dataset=d, run=r, seed=s) for d, r, s in CLUSTERED],
                out=PROTOCOLS["out"] + "-clusters",
            shell:
                "mcfl report-writers --store {input.store:q} --out {params.out:q} {params.runs:q} "
                "> {log:q} 2>&1"

        EXTRA_TARGETS += list(rules.writer_clusters.output)
