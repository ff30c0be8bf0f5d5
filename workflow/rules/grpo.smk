# GRPO runs: per-domain experts, joint GRPO on a domain mix, and GRPO-trained teachers.


rule grpo:
    input:
        lambda w: upstream_done(w.run),
    output:
        f"{ROOT}/runs/{{run}}/done.json",
    log:
        f"{LOGS}/{{run}}.log",
    wildcard_constraints:
        run=id_pattern(job_ids("train", "grpo")),
    priority: lambda w: PRIORITY[w.run]
    threads: THREADS
    resources:
        **job_resources("train"),
        attempt=lambda w, attempt: attempt,
    params:
        cfg=lambda w: job_config(w.run),
        out=lambda w: PLAN.jobs[w.run].out_dir,
    shell:
        TRAIN_SHELL
