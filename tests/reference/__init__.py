"""The one-image decoding loops the toolkit had before the engine, kept as oracles.

Each is the former batch-1 loop of its method, as it was: :mod:`.chain` (AR and chain
speculative decoding), :mod:`.trees` and :mod:`.tree_decoding` (EAGLE-1 static / EAGLE-2 dynamic
draft trees), :mod:`.jacobi` (SJD / GSD / SCD), over a batch-1 cache (``prefill`` / ``extend`` /
``rollback`` / ``extend_tree`` / ``keep_path``): :class:`.cache.OneImageCache`, written over the
models' slot protocol (the models no longer carry a batch-1 cache).
``tests/test_engine.py`` holds the engine to them: in float64 the engine's tokens and records
equal theirs for every method, tree, convention and sampling setting, at B = 1 and B > 1.
"""
