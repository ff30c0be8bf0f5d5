# The report: curves, plots, savings and claims from every run directory of this profile.
# Figures and tables are registered with report(), so `snakemake --report report.html` gives one page.

from opdgrpo.plan.studies import REGISTRY
from opdgrpo.report.code_identity import code_digest

REPORT_DIR = f"{ROOT}/report"
REPORT_STUDIES = [s for s in PLAN.report_spec["studies"]]
REPORT_FIGURES = [f"{REPORT_DIR}/{s}_{kind}.png" for s in REPORT_STUDIES for kind in REGISTRY[s].figure_stems]
REPORT_TABLES = [
    f"{REPORT_DIR}/{s}_{stem}.{ext}"
    for s in REPORT_STUDIES
    for stem in REGISTRY[s].table_stems
    for ext in ("md", "csv")
]
REPORT_OUTPUTS = [
    f"{REPORT_DIR}/curves.csv",
    f"{REPORT_DIR}/savings.csv",
    f"{REPORT_DIR}/savings.md",
    f"{REPORT_DIR}/claims.md",
    f"{REPORT_DIR}/claims_detail.md",
    f"{REPORT_DIR}/base_models.md",
    f"{REPORT_DIR}/constraints.md",
    f"{REPORT_DIR}/conditions.md",
    f"{REPORT_DIR}/mfu.md",
    *REPORT_FIGURES,
    *REPORT_TABLES,
]


rule report:
    input:
        runs=[j.done for j in PLAN.runs()],
        base=[j.done for j in PLAN.by_kind("base")],
        selections=[j.done for j in PLAN.by_kind("difficulty")],
    output:
        report(f"{REPORT_DIR}/curves.csv", category="Tables", caption="../report/curves.rst"),
        report(f"{REPORT_DIR}/savings.csv", category="Tables", caption="../report/savings.rst"),
        f"{REPORT_DIR}/savings.md",
        report(f"{REPORT_DIR}/claims.md", category="Tables", caption="../report/claims.rst"),
        f"{REPORT_DIR}/claims_detail.md",
        f"{REPORT_DIR}/base_models.md",
        f"{REPORT_DIR}/constraints.md",
        f"{REPORT_DIR}/conditions.md",
        f"{REPORT_DIR}/mfu.md",
        *[report(f, category="Figures", caption="../report/figure.rst") for f in REPORT_FIGURES],
        *REPORT_TABLES,
    log:
        f"{LOGS}/report.log",
    resources:
        **job_resources("report"),
    params:
        spec=json.dumps(PLAN.report_spec, sort_keys=True),
        code=code_digest(),  # a change to the report's code re-renders it (opdgrpo.report.code_identity)
        out=REPORT_DIR,
        runs=f"{ROOT}/runs",
    shell:
        "mkdir -p {params.out} && printf '%s' {params.spec:q} > {params.out}/spec.json && "
        "{OPDGRPO} report --spec {params.out}/spec.json --runs {params.runs} --out {params.out} > {log} 2>&1"


# `snakemake publish`: copy the report's figures (PNG) and tables into docs/results/<profile>/, the files the
# README shows. Not part of `all`: docs/ changes only when asked.
PUBLISH_DIR = f"docs/results/{CFG['profile']}"


rule publish:
    input:
        REPORT_OUTPUTS,
    output:
        directory(PUBLISH_DIR),
    log:
        f"{LOGS}/publish.log",
    params:
        files=[f for f in REPORT_OUTPUTS if f.endswith((".png", ".md"))],
    shell:
        "(rm -rf {output} && mkdir -p {output} && cp {params.files} {output}/) > {log} 2>&1"
