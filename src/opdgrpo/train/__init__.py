"""Post-training: the loop a GRPO or OPD run follows (:mod:`~opdgrpo.train.loop`, top to bottom in one file) and the
parts it is built from: the losses (:mod:`~opdgrpo.train.objectives`, :mod:`~opdgrpo.train.losses`), sampling
(:mod:`~opdgrpo.train.rollout`, :mod:`~opdgrpo.train.sampling`, :mod:`~opdgrpo.train.inference`,
:mod:`~opdgrpo.train.engines`), a step's batches and shards (:mod:`~opdgrpo.train.batching`,
:mod:`~opdgrpo.train.packing`, :mod:`~opdgrpo.train.microbatch`, :mod:`~opdgrpo.train.logit_chunks`), several
processes (:mod:`~opdgrpo.train.distributed`, :mod:`~opdgrpo.train.fsdp`), checkpoints and input checks
(:mod:`~opdgrpo.train.checkpoint`, :mod:`~opdgrpo.train.preflight`), the FLOP ledger's formulas
(:mod:`~opdgrpo.train.flops`) and a step's record (:mod:`~opdgrpo.train.step_stats`), held-out evaluation
(:mod:`~opdgrpo.train.evaluation`), and the models, tokenizers and numerics they run on.

This package imports nothing that plans, prices or reports: a run reads its job config and writes its run directory.
"""
