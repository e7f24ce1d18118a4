# The report as a documentation page with its provenance (`publish:`; mcfl.report.publish), written
# inside the results directory (<results>/docs/...); `make docs-results` copies it into docs/.

if P.publishing.publish:

    rule publish:
        input:
            table=P.res("table.md"),
            figures=rules.report.output.figures,
            runs=P.run_outputs("metrics.json"),
        output:
            P.publishing.publish["out"] + ".md",
        log:
            P.logs("publish.log"),
        params:
            results=lambda w: P.results,
            runs=P.run_dirs(),
            out=lambda w: P.publishing.publish["out"],
            title=P.publishing.publish["title"],
            config=(
                os.path.relpath(workflow.overwrite_configfiles[0])
                if workflow.overwrite_configfiles
                else "config/config.yaml"
            ),
        shell:
            "mcfl publish --results {params.results:q} --out {params.out:q} --config {params.config:q} "
            "--title {params.title:q} {params.runs:q} > {log:q} 2>&1"
