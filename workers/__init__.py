"""Kernel-exercise grader core: exercises, sandbox, harness, verdicts and results.

Celery-free on purpose: a task module calls :func:`workers.harness.grade` (or the CLI does) and
stores :meth:`GradeResult.to_results_json`. Dependency direction: service -> workers -> kernels;
nothing here imports flask or service.
"""
