"""The paper campaigns, built on top of the package and shown apart from its core: :mod:`.reproduce` (the seed
papers' findings, pre-registered and archived) and :mod:`.studies` (injection campaigns, per-bit sensitivity).
Each drives many runs through the sweeps (:mod:`workbench.launch.sweeps`) and the public API. Importing this
package imports none of its modules.
"""
