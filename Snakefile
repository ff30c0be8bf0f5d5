# Found automatically by `snakemake` run from the repository root. Snakemake 9 then picks up the workflow profile
# profiles/default, which is workflow/profiles/default through the link `profiles -> workflow/profiles`
# (see docs/design-notes.md).
# The whole reproduction as one DAG. Scale: `snakemake --config profile=smoke|tiny`; any other
# setting: `snakemake --config 'overrides=["methods.opd.lr=1e-4"]'` (Hydra override syntax).
# conf/ -> plan (opdgrpo.plan.build) -> one job per run -> run directories -> report.
from pathlib import Path

from opdgrpo.config import compose, workflow_overrides
from opdgrpo.plan.build import build_plan
from opdgrpo.cost.resources import refuse_unfit, stop_settings

CFG = compose(workflow_overrides(config), Path(workflow.basedir) / "conf")
PLAN = build_plan(CFG)
ROOT = PLAN.root
# Each GPU job's estimated peak memory against the profile's `hardware` block (opdgrpo.cost.resources; `opdgrpo resources`
# prints the estimates): a job that would not fit is refused here, naming the knob, before anything is scheduled.
ESTIMATES = refuse_unfit(CFG, PLAN)


include: "workflow/rules/common.smk"
include: "workflow/rules/base.smk"
include: "workflow/rules/difficulty.smk"
include: "workflow/rules/grpo.smk"
include: "workflow/rules/opd.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        REPORT_OUTPUTS,
