# `tracking: deferred`: training jobs skip MLflow; this job records every finished run from its
# files afterwards (mcfl.track.record_finished), nested under this invocation's sweep run. Runs
# already recorded (same metrics.json) are not recorded twice.

if config["tracking"] == "deferred":

    rule track:
        input:
            [d + "/metrics.json" for d in run_dirs()],
        output:
            RES + "/mlflow_runs.tsv",
        log:
            LOGS + "/track.log",
        params:
            experiment=config["experiment"],
            runs=lambda w, input: [os.path.dirname(f) for f in input],
        shell:
            "mcfl track --experiment {params.experiment:q} --out {output:q} {params.runs:q} > {log:q} 2>&1"

    EXTRA_TARGETS.append(rules.track.output[0])
