"""The peers' supervisor side: starting their services and agents (:mod:`.supervision`) and reading their
ranks' messages into the run's record (:mod:`.adapters`, one adapter per peer). The peers' names are
:mod:`workbench.strategies.peers`, their rank side :mod:`workbench.rank.peers`. Importing this package
imports none of its modules.
"""
