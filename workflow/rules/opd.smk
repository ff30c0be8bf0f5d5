# OPD runs: external-teacher, self-teacher and multi-teacher on-policy distillation.
# tokenizer + student + teachers (+ S2's selection) -> runs/<run>/ (checkpoint, ledger, evaluations, done.json)


rule opd:
    input:
        tokenizer=consumed("tokenizer"),
        student=consumed("student"),
        teachers=consumed("teachers"),  # base models (external teachers) or GRPO runs (experts)
        selection=consumed("selection"),
    output:
        f"{ROOT}/runs/{{run}}/done.json",
    log:
        f"{LOGS}/{{run}}.log",
    wildcard_constraints:
        run=id_pattern(job_ids("train", "opd")),
    priority: lambda w: PRIORITY[w.run]
    threads: THREADS
    resources:
        **job_resources("train", lambda w: w.run),
        **stop_resources(lambda w: w.run),
        attempt=lambda w, attempt: attempt,
    params:
        cfg=lambda w: job_config(w.run),
        out=lambda w: PLAN.jobs[w.run].out_dir,
    shell:
        TRAIN_SHELL
