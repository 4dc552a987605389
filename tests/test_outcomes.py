import math

import pandas as pd

from workbench.campaigns.studies.sensitivity import outcome_shares
from workbench.faults.outcomes import classify_values


def test_outcome_classes():
    assert classify_values(0.95, 0.955, [1.0, 0.5], True, 0.01) == "masked"
    assert classify_values(0.90, 0.955, [1.0, 0.5], True, 0.01) == "degraded"
    assert classify_values(0.10, 0.955, [1.0, math.nan], True, 0.01) == "nonfinite"
    assert classify_values(0.10, 0.955, [1e35, 1e35], True, 0.01) == "degraded"  # huge but finite: not NaN
    assert classify_values(None, 0.955, [], False, 0.01) == "crash"


def test_outcome_shares_with_wilson_intervals():
    frame = pd.DataFrame({"bit": [30] * 4 + [0] * 4, "field": ["exponent"] * 4 + ["mantissa"] * 4,
                          "outcome": ["nonfinite", "nonfinite", "masked", "degraded"] + ["masked"] * 4})
    shares = outcome_shares(frame).set_index(["bit", "outcome"])
    assert shares.loc[(30, "nonfinite"), "share"] == 0.5 and shares.loc[(0, "masked"), "share"] == 1.0
    low, high = shares.loc[(30, "nonfinite"), ["low", "high"]]
    assert 0 < low < 0.5 < high < 1
    assert shares.groupby("bit").share.sum().tolist() == [1.0, 1.0]


def test_possible_outcomes_follow_the_size_of_the_flip():
    import numpy as np

    from workbench.faults.outcomes import possible_outcomes

    def flipped(value: float, bit: int) -> float:
        return float((np.float32(value).view(np.uint32) ^ np.uint32(1 << bit)).view(np.float32))

    assert possible_outcomes(0.3, flipped(0.3, 0)) == ("masked",)
    assert possible_outcomes(-0.3, flipped(-0.3, 10)) == ("masked",)  # 2**-13 of the value at most
    assert "degraded" in possible_outcomes(0.3, flipped(0.3, 11))
    assert possible_outcomes(1.5, flipped(1.5, 30)) == ("nonfinite",)  # exponent all ones: inf
    assert possible_outcomes(0.3, float("nan")) == ("nonfinite",)
    assert "crash" not in possible_outcomes(0.3, flipped(0.3, 30))  # 0.3 * 2**128 is finite in float64
