"""The broker load test (``python -m loadtest``): a private local stack, one or more HTTP brokers
(``python -m broker_lite``), and vegeta as the load generator; every run leaves a directory
under ``loadtest/results/`` and prints a summary JSON line. ``python -m bench broker`` runs the
same scenarios for longer. Modules: :mod:`loadtest.scenarios` (what each phase sends),
:mod:`loadtest.vegeta` (install, attack, results), :mod:`loadtest.brokers` (broker processes,
``/metrics`` sampling), :mod:`loadtest.probe` (the long-poll latency probe),
:mod:`loadtest.run` (phases, run directory, summary).
"""
