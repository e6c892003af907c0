"""What runs inside the sandboxed runner process, besides its entry script ``../runner.py``.

Stdlib and torch only, and nothing from ``workers``: the job copies this package next to the
runner script into its read-only harness directory (``workers.harness.job.RUNNER_FILES``), and
the sandbox sees neither the grader package nor the reference kernels. The trusted checker
imports ``wire``, ``digests`` and ``inputs`` from here too: one definition of the raw tensor
format, the digests and the timing inputs on both sides of the trust boundary.
"""
