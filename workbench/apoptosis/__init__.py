"""Adaptive neuron apoptosis: the rule and the model surgery."""
