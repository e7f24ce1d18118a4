# mcfl reproduction workflow: prepare data -> initialise cluster centres -> train every
# (dataset, method, K, seed) -> report. Training logic lives in the `mcfl` package; rules call its CLI.
#
#   snakemake --cores all                               # everything in config/config.yaml
#   snakemake --cores all --configfile config/paper-femnist.yaml   # that config alone
#   snakemake -n                                         # what would run
#   snakemake --report report.html                       # tables and figures with captions
import os
import sys

from snakemake.utils import min_version

min_version("9.0")


# The default config applies only when no --configfile is given: Snakemake would otherwise merge a
# paper config into it (its datasets dict with the default datasets, so those would run too).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


# The rules call the `mcfl` command: Snakemake's own environment first on PATH, so that
# `.venv/bin/snakemake` works without an activated environment.
envvars:
    "PATH",


os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/partition.smk"
include: "workflow/rules/init.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/papers.smk"
include: "workflow/rules/select_k.smk"
include: "workflow/rules/protocols.smk"
include: "workflow/rules/publish.smk"
include: "workflow/rules/track.smk"
include: "workflow/rules/replication.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
        EXTRA_TARGETS,
