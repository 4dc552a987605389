"""Studies built on runs, beside the reproductions (:mod:`workbench.campaigns.reproduce`): injection campaigns against a
golden run (:mod:`.campaign`) and the per-bit sensitivity of a checkpoint (:mod:`.sensitivity`).
"""
