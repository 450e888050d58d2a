"""What runs inside every run's Job (``pkobatch job run``), and in ``pkobatch run``.

``execute`` (one run, never raising) ties together: ``git`` (checkout), ``workspace`` (the
program, its dependencies, run inline), ``stack_config`` (config to set), ``pulumi_cli`` (the
Automation API adapted to cancellation and masked outputs), ``cancel`` (SIGTERM handling),
``failures`` (reasons and messages), ``redact`` and ``run_log`` (no secret in any output) and
``result`` (bounds, the ConfigMap). ``job`` adds reading the run's Job and writing the result
(``report``); ``embedded`` turns a Stack manifest into a run on this machine. See
docs/runner.md.
"""
