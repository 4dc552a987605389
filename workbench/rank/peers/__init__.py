"""The peers' rank side: the rank processes of torchft, torchrun and ULFM (``python -m
workbench.rank.peers.<peer>_rank``), which speak our control protocol and train the way that peer's users
do; :mod:`.common` is what they share. The peers' names are :mod:`workbench.strategies.peers`, their
supervisor side :mod:`workbench.supervisor.peers`. Importing this package imports none of its modules.
"""
