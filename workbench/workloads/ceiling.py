"""Each dataset's accuracy ceiling: the test accuracy no model can beat on it, a Bayes or oracle
estimate, reported beside every accuracy of the reproductions. ``synthetic_noisy`` and ``synthetic``: the Bayes
rule itself (the exact posterior under the generating model), scored on fresh draws. ``synthetic_image``: a
bracket, the matched-filter oracle that knows the ten patterns (a lower bound) and the genie that also sees both
patterns' weights (an upper bound: 1 - 0.375/2). ``digits``: a strong reference model, labelled so. A registry
entry names its function as ``ceiling`` (:class:`workbench.workloads.registry.Dataset`); docs/reproduce.md,
"Ceilings".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.base.extras import need
from workbench.workloads.registry import SPLIT_SEED  # synthetic(size) draws its centres from it + size

DRAW_SEED = 20261128  # the fresh draws a ceiling is scored on: not the training or test split of any size


@dataclass(frozen=True)
class Ceiling:
    """A dataset's accuracy ceiling (0-1): the estimate, its interval or bracket [low, high], how it was found
    (``bayes``: the Bayes rule scored on ``n`` draws; ``oracle``: a rule that knows the generating model, below the
    Bayes rule, with ``high`` an upper bound; ``reference``: a strong model's test accuracy) and what it means."""

    accuracy: float
    low: float
    high: float
    method: str
    n: int
    note: str

    def line(self) -> str:
        return (f"ceiling {100 * self.accuracy:.1f} % [{100 * self.low:.1f}, {100 * self.high:.1f}] "
                f"({self.method}, n = {self.n}): {self.note}")


def _wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p, d = hits / n, 1 + z * z / n
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (p + z * z / (2 * n)) / d - half, (p + z * z / (2 * n)) / d + half


# -- synthetic_image and synthetic_noisy -------------------------------------------------------------------------
def correlations(x: np.ndarray, patterns: np.ndarray) -> np.ndarray:
    """``<x, P_k shifted by s>`` for every image, class and cyclic shift (n, classes, side * side), by FFT."""
    fx, fp = np.fft.rfft2(x.astype(np.float64)), np.fft.rfft2(patterns.astype(np.float64))
    side = x.shape[-1]
    spectrum = np.einsum("ncij,kcij->nkij", fx, np.conj(fp))
    return np.fft.irfft2(spectrum, s=(side, side)).reshape(len(x), len(patterns), -1)


def log_likelihoods(x: np.ndarray, patterns: np.ndarray, gain: tuple[float, float], noise: float) -> np.ndarray:
    """``log p(x | class)`` up to a constant shared by the classes (n, classes), for images that are one class's
    pattern at a uniform random cyclic shift and a uniform gain in ``gain``, plus a per-channel cast and Gaussian
    noise of sd ``noise``: the cast is orthogonal to every pattern (zero mean per channel), so it cancels; the gain
    is integrated in closed form, the shifts summed."""
    special = need("scipy.special", "studies", "the Bayes ceilings")
    log_ndtr, logsumexp = special.log_ndtr, special.logsumexp

    energy = float((patterns[0].astype(np.float64) ** 2).sum())  # the same for every class and shift
    r = correlations(x, patterns) / energy  # the gain that fits best at each shift
    tau = noise / np.sqrt(energy)  # its standard error
    lo, hi = (gain[0] - r) / tau, (gain[1] - r) / tau
    # log(Phi(hi) - Phi(lo)), stably on either tail: mirrored where both lie above 0
    upper = lo > 0
    a, b = np.where(upper, -hi, lo), np.where(upper, -lo, hi)
    mass = log_ndtr(b) + np.log1p(-np.exp(np.minimum(log_ndtr(a) - log_ndtr(b), -1e-300)))
    return logsumexp(r * r / (2 * tau * tau) + mass, axis=2)


def fresh_images(n: int, distractor: float, signal: float, seed: int = DRAW_SEED) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images drawn as the dataset draws them (uint8, then back in the patterns' units) and their labels."""
    from workbench.workloads.datasets import SCALE, class_patterns, draw_images

    images, labels = draw_images(np.random.default_rng(seed), class_patterns(), n, distractor, signal)
    return (images.astype(np.float64) - 128) / SCALE, labels


def genie_bound(distractor: float, signal: float = 1.0) -> float:
    """The accuracy of a rule told both classes present and their weights (no noise): the label's weight is
    uniform on signal x GAIN, the other's on [0, distractor]; where both weights fit both ranges the two
    orders are equally likely (uniform densities), so it guesses. No rule that sees only the image does better."""
    from workbench.workloads.datasets import GAIN

    g_lo, g_hi = signal * GAIN[0], signal * GAIN[1]
    overlap = max(0.0, min(g_hi, distractor) - max(g_lo, 0.0))
    ambiguous = (overlap / (g_hi - g_lo)) * (overlap / distractor) if distractor > 0 else 0.0
    return 1.0 - ambiguous / 2


def synthetic_ceiling(distractor: float, signal: float = 1.0, n: int = 4096, chunk: int = 512) -> Ceiling:
    """Without a second class: the Bayes rule (:func:`log_likelihoods`; the rounding to 8 bits added to the
    noise as its variance) scored on ``n`` fresh draws, with a Wilson 95 % interval. With one: the matched-filter
    oracle (the class whose pattern correlates best at any shift), a lower bound, and :func:`genie_bound` above."""
    from workbench.workloads.datasets import GAIN, NOISE, SCALE, class_patterns

    patterns = class_patterns()
    x, y = fresh_images(n, distractor, signal)
    noise = float(np.sqrt(NOISE ** 2 + 1 / (12 * SCALE ** 2)))
    gain = (signal * GAIN[0], signal * GAIN[1])
    hits = 0
    for start in range(0, n, chunk):
        part = x[start: start + chunk]
        if distractor > 0:
            guess = correlations(part, patterns).max(axis=2).argmax(axis=1)
        else:
            guess = log_likelihoods(part, patterns, gain, noise).argmax(axis=1)
        hits += int((guess == y[start: start + chunk]).sum())
    low, high = _wilson(hits, n)
    if distractor > 0:
        return Ceiling(hits / n, low, genie_bound(distractor, signal), "oracle", n,
                       f"the matched filter that knows the patterns (a lower bound on the Bayes rule); above it the "
                       f"genie that sees both patterns' weights, {100 * genie_bound(distractor, signal):.2f} %")
    return Ceiling(hits / n, low, high, "bayes", n, "the Bayes rule (every shift, the gain integrated), scored on "
                   "fresh draws; 95 % Wilson interval")


def synthetic_image_ceiling(size: int = 0) -> Ceiling:
    """``synthetic_image``'s (the same for every size)."""
    from workbench.workloads.datasets import DISTRACTOR

    return synthetic_ceiling(DISTRACTOR)


def synthetic_noisy_ceiling(size: int = 0) -> Ceiling:
    """``synthetic_noisy``'s (the same for every size)."""
    from workbench.workloads.datasets import NOISY_SIGNAL

    return synthetic_ceiling(0.0, NOISY_SIGNAL)


def synthetic_faint_ceiling(size: int = 0) -> Ceiling:
    """``synthetic_faint``'s (the same for every size)."""
    from workbench.workloads.datasets import FAINT_SIGNAL

    return synthetic_ceiling(0.0, FAINT_SIGNAL)


# -- synthetic (Gaussian clusters) and digits ----------------------------------------------------------------------
def gaussian_ceiling(size: int, n: int = 20000) -> Ceiling:
    """``synthetic``'s: its class centres (as ``workbench.workloads.data.synthetic(size)`` draws them) under
    isotropic noise of sd 1.2, equal priors: the Bayes rule is the nearest centre, scored on ``n`` fresh draws."""
    centres = np.random.default_rng(SPLIT_SEED + size).normal(0.0, 1.0, size=(10, 64))
    rng = np.random.default_rng(DRAW_SEED)
    y = rng.integers(0, 10, size=n)
    x = centres[y] + rng.normal(0.0, 1.2, size=(n, 64))
    guess = ((x[:, None, :] - centres[None]) ** 2).sum(axis=2).argmin(axis=1)
    hits = int((guess == y).sum())
    return Ceiling(hits / n, *_wilson(hits, n), "bayes", n, "the nearest class centre (the Bayes rule), on fresh "
                   "draws; 95 % Wilson interval")


def digits_ceiling(size: int = 0) -> Ceiling:
    """``digits``': no generating model is known, so a strong reference model's test accuracy on the same split
    (an RBF support-vector machine, scikit-learn's defaults): a floor under the ceiling, not a Bayes bound."""
    from sklearn.svm import SVC

    from workbench.workloads.data import digits

    data = digits()
    model = SVC().fit(data.x_train.reshape(len(data.x_train), -1).numpy(), data.y_train.numpy())
    hits = int((model.predict(data.x_test.reshape(len(data.x_test), -1).numpy()) == data.y_test.numpy()).sum())
    n = len(data.y_test)
    return Ceiling(hits / n, *_wilson(hits, n), "reference", n, "a reference model (RBF SVM) on the test split: a "
                   "floor under the ceiling, not a Bayes bound")


# -- mnist1d ---------------------------------------------------------------------------------------------------------
# measured by benchmarks/mnist1d_ceiling.py (the JSON it writes: benchmarks/results/mnist1d_ceiling.json)
MNIST1D_REFERENCE = {"accuracy": 0.988, "seeds": [0, 1, 2], "steps": 8000}  # 2026-12-07: 0.984, 0.990, 0.990


def mnist1d_ceiling(size: int = 0) -> Ceiling:
    """``mnist1d``'s: no generating density to integrate, so the best test accuracy a larger model trained longer
    reaches (``mnist1d_reference``, :data:`MNIST1D_REFERENCE`, its mean over seeds): a floor under the ceiling."""
    hits, n = round(MNIST1D_REFERENCE["accuracy"] * 1000), 1000
    return Ceiling(hits / n, *_wilson(hits, n), "reference", n, f"a larger CNN (mnist1d_reference) at "
                   f"{MNIST1D_REFERENCE['steps']} steps, mean of seeds {MNIST1D_REFERENCE['seeds']}: a floor under "
                   "the ceiling, not a Bayes bound")
