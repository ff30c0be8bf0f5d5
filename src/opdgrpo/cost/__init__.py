"""What a plan costs before it runs: FLOPs per run (:mod:`~opdgrpo.cost.model`, from the trainer's own formulas in
:mod:`opdgrpo.train.flops`), the step counts that meet the paper's budgets (:mod:`~opdgrpo.cost.solve`), GPU memory and
time per job (:mod:`~opdgrpo.cost.resources`, with :mod:`~opdgrpo.cost.memory_model`,
:mod:`~opdgrpo.cost.engine_memory` and the measured activations of :mod:`~opdgrpo.cost.memprobe`), Snakemake
priorities (:mod:`~opdgrpo.cost.schedule`), and the ``opdgrpo flops`` command (:mod:`~opdgrpo.cost.cli`).
"""
