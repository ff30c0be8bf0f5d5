"""The plan: conf -> the jobs of the DAG and the report spec.

:mod:`~opdgrpo.plan.planner` is the planner's vocabulary (a job, the plan, the :class:`Planner` the studies ask for
runs); :mod:`~opdgrpo.plan.build` checks each study's block and drives the studies (:mod:`opdgrpo.plan.studies`) through
a planner. Nothing here trains, prices or reports.
"""
