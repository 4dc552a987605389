"""What each recovery strategy costs at 1,000–100,000 ranks: a model of effective training time from per-failure
costs (:mod:`.costs`), a failure process and the strategies' recoveries (:mod:`.profiles`), as a first-order
closed form (:mod:`.closed_form`) and a discrete-event simulation (:mod:`.simulate`), checked against published
figures (:mod:`.published`). A leaf: it imports nothing of the workbench but its errors. docs/scale.md.
"""

from workbench.strategies.scale.costs import CostLaw, Costs, load_costs
from workbench.strategies.scale.predict import crossover, predict, scenario
from workbench.strategies.scale.profiles import NAMES, PROFILES, Profile, profile
from workbench.strategies.scale.result import Prediction
from workbench.strategies.scale.scenario import FailureProcess, Scenario

__all__ = ["NAMES", "PROFILES", "CostLaw", "Costs", "FailureProcess", "Prediction", "Profile", "Scenario",
           "crossover", "load_costs", "predict", "profile", "scenario"]
