# Does each paired comparison replicate on other draws of the clients? The config's `replication`
# section (mcfl.replication) made each draw a dataset, so the train rules train its runs; this rule
# compares every chosen method with the reference on every draw and protocol (mcfl.replication_report).
# Nothing is added without `replication`. Every training job of a redrawn dataset waits for the
# draws' check (the original dataset's jobs are those of the config without the section).

from mcfl.replication import ReplicationPlan

REPLICATION = ReplicationPlan(P)
EXTRA_TARGETS.extend(REPLICATION.targets())
P.gates.update(REPLICATION.gate())  # the redrawn datasets' jobs wait for replication_check

if REPLICATION:

    # Before any training: every draw's store verified in full, with the clients a round samples;
    # a draw that fails stops the workflow with one line.
    rule replication_check:
        input:
            REPLICATION.store_files(),
        output:
            REPLICATION.check_file(),
        log:
            P.logs("replication_check.log"),
        params:
            stores=REPLICATION.stores(),
            sampled=REPLICATION.sampled(),
        shell:
            "mcfl check-draws --out {output:q} --sampled {params.sampled:q} {params.stores:q} > {log:q} 2>&1 "
            "|| {{ tail -n 1 {log:q} >&2; exit 1; }}"

    rule replication:
        input:
            metrics=REPLICATION.run_outputs("metrics.json"),
            predictions=REPLICATION.run_outputs("predictions.csv"),
        output:
            markdown=REPLICATION.out() + ".md",
            csv=REPLICATION.out() + ".csv",
            figure=report(REPLICATION.out() + ".png", category="Figures"),
        log:
            P.logs("replication.log"),
        params:
            runs=P.run_dirs(REPLICATION.runs()),
            out=lambda w: REPLICATION.out(),
            reference=REPLICATION.section["reference"],
            draws=REPLICATION.draw_order(),
            protocols=REPLICATION.section["protocols"],
        shell:
            "mcfl report-replication --out {params.out:q} --reference {params.reference:q} "
            "--draws {params.draws:q} --protocols {params.protocols:q} --runs {params.runs:q} > {log:q} 2>&1"
