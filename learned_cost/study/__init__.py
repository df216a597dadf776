"""Studying the learned cost model: training, baselines, held-out evaluation and plan metrics.

Imports scikit-learn, scipy and matplotlib; what serving loads lives one level up.
"""
