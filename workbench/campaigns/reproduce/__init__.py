"""The seed papers' findings, reproduced with statistics: one module per paper, each with the campaign (run
through the public API, every run cached), its statistics, the figure in the paper's form and the
:class:`~workbench.campaigns.reproduce.common.Verdict` its notebook (``notebooks/reproduce/``) saves and asserts:
:mod:`.ccgrid22`, :mod:`.jpdc24`, :mod:`.europmpi17`, :mod:`.gossipgrad`, :mod:`.apoptosis`. ``make reproduce``
runs the notebooks at ``scale="paper"``; :mod:`workbench.campaigns.reproduce.report` assembles the report. See
docs/reproduce.md.
"""
