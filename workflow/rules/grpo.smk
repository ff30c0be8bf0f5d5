# GRPO runs: per-domain experts, joint GRPO on a domain mix, and GRPO-trained teachers.
# tokenizer + student (+ S2's selection) -> runs/<run>/ (checkpoint, ledger, evaluations, done.json)


rule grpo:
    input:
        tokenizer=consumed("tokenizer"),
        student=consumed("student"),  # a base model, or a run it continues from
        selection=consumed("selection"),  # S2: the difficulty subset it trains on
    output:
        f"{ROOT}/runs/{{run}}/done.json",
    log:
        f"{LOGS}/{{run}}.log",
    wildcard_constraints:
        run=id_pattern(job_ids("train", "grpo")),
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
