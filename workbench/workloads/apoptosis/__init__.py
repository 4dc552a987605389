"""Adaptive neuron apoptosis: :mod:`.rule` (when a unit goes, :class:`~.rule.ApoptosisConfig`) and
:mod:`.surgery` (finding units, their norms, the group lasso, and removing them from a model and its optimizer).
"""
