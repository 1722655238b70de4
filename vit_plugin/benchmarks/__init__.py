"""Measurements of vit_plugin: speed, memory and cost of its parts, next to its peers (``tools/analysis/*``).

Nothing in the product imports this package, and ``import vit_plugin`` does not load it. Every module
with a ``main`` is the code of the ``tools/analysis`` script of the same name (``benchmark_models`` runs
``tools/analysis/benchmark.py``, ``memory_planner`` runs ``tools/analysis/memory.py``). The shared
measuring helpers are :mod:`.timing` (the timing loop), :mod:`.peak_memory` (the peak-memory probes) and
:mod:`.toy_classifier` (a ViT plus a linear head).
"""
