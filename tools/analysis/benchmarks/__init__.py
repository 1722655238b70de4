"""Measurements of vit_plugin: speed, memory and cost of its parts, next to its peers (``tools/analysis/*``).

A package of the checkout, beside the scripts that run it and outside the installed ``vit_plugin``: it
imports ``vit_plugin``, never the other way round. A script under ``tools/analysis/`` has this folder's
parent first on ``sys.path`` and imports ``benchmarks.<module>``; the tests do the same (``pytest.ini``).
Every module with a ``main`` is the code of the ``tools/analysis`` script of the same name
(``benchmark_models`` runs ``tools/analysis/benchmark.py``, ``memory_planner`` runs
``tools/analysis/memory.py``). The shared measuring helpers are :mod:`.timing` (the timing loop),
:mod:`.peak_memory` (the peak-memory probes) and :mod:`.toy_classifier` (a ViT plus a linear head).
"""
