# Every registered paper's tables and figures (mcfl.papers: FeSEM's Figs. 4-5, FedCG's Tables 3-5,
# FedGSP's Table 1 and Figs. 3-6, and any paper an installed package registers in the `mcfl.papers`
# entry-point group): one rule per job its planner lists (mcfl.plan.Plan.paper_jobs), each running
# `mcfl paper <paper> <output> ...` (or the command the job names) with the job's arguments. A new
# paper needs no edit here nor in the Snakefile. Outputs a job names in `reports` go into Snakemake's
# report with their caption (workflow/report/) and category.

for job in P.paper_jobs():

    rule:
        name:
            job.rule
        input:
            **job.input,
        output:
            **{
                k: (
                    report(v, caption=f"../report/{job.reports[k][0]}", category=job.reports[k][1])
                    if k in job.reports
                    else v
                )
                for k, v in job.outputs.items()
            },
        log:
            job.log,
        benchmark:
            job.benchmark
        threads: job.threads
        resources:
            gpu=job.gpu,
        params:
            command=job.command,
            args=job.args,
        shell:
            "mcfl {params.command:q} {params.args:q} > {log:q} 2>&1"
