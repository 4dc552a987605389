"""The seed papers' findings, reproduced with statistics: one module per paper, each with the campaign (run through
the public API, every run cached so an interrupted campaign resumes), its statistics, the figure in the paper's
form and the :class:`~workbench.reproduce.common.Verdict` its notebook (``notebooks/reproduce/``) saves and
asserts. ``make reproduce`` runs the notebooks at ``scale="paper"`` and :mod:`workbench.reproduce.report`
assembles ``runs/reproduce/report.html``.

- :mod:`.ccgrid22` — low-overhead resilience (checkpoint-restart vs rollback vs forward, random failures)
- :mod:`.jpdc24` — soft errors by checkpoint alteration, data- vs model-parallel
- :mod:`.europmpi17` — shrink vs Reinit vs checkpoint-restart against 0-3 failures
- :mod:`.gossipgrad` — gossip SGD vs allreduce
- :mod:`.apoptosis` — adaptive neuron apoptosis over seeds, with the lasso=0 ablation
"""
