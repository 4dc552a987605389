"""Sweeps of a notebook over a grid of parameters."""
