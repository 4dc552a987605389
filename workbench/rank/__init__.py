"""Code that runs inside a rank process, ours (:mod:`.main`) and the peers' (:mod:`.peers`). The messages between
the ranks and the supervisor are :mod:`workbench.base.protocol`. Nothing here imports the supervisor, the doors
(session, Lab panel, sweeps) or plots."""
