"""Measurements on the platform: the operator at 1,000 InferenceServices on the local cluster
(``bench_scale.py``) and the cost of its metrics exposition (``bench_exposition.py``).
"""
