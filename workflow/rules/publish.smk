# The report copied into the documentation with its provenance (`publish:`; mcfl.report.publish).

PUBLISH = config.get("publish")

if PUBLISH:

    rule publish:
        input:
            table=RES + "/table.md",
            figures=rules.report.output.figures,
            runs=[d + "/metrics.json" for d in run_dirs()],
        output:
            PUBLISH["out"] + ".md",
        log:
            LOGS + "/publish.log",
        params:
            results=RES,
            runs=run_dirs(),
            out=PUBLISH["out"],
            title=PUBLISH["title"],
            config=workflow.overwrite_configfiles[0] if workflow.overwrite_configfiles else "config/config.yaml",
        shell:
            "mcfl publish --results {params.results:q} --out {params.out:q} --config {params.config:q} "
            "--title {params.title:q} {params.runs:q} > {log:q} 2>&1"

    EXTRA_TARGETS.append(rules.publish.output[0])
