"""What an optimizer does with a gradient that is pure noise: closed-form and simulated drift.

The gradient of b_k is zero in exact arithmetic and rounding noise in floating point. These
functions predict how far that noise moves b_k: SGD by lr times the noise (a random walk of
tiny steps), Adam by about lr per step in a random direction unless eps exceeds the noise.
"""

from __future__ import annotations

import math

import numpy as np

from keybias.studies.params import check_positive_int
from keybias.studies.training.model import ADAM_BETAS

# ----------------------------------------------------------------------------- predictions


def random_walk_drift(grad_rms: np.ndarray, *, lr: float, eps: float, n_elements: int,
                      betas: tuple[float, float] = ADAM_BETAS) -> float:
    """Closed-form estimate of ||b_k(T) - b_k(0)|| under Adam when the b_k gradient is zero-mean
    noise (Eq. training_adam_drift of the paper).

    Adam's step for one element is lr * m_hat / (sqrt(v_hat) + eps). For uncorrelated noise
    g_t of RMS sigma_t the first moment m is a moving average whose contributions sum, over
    the run, to each g_t once, so the summed step is a random walk
        Delta ~ lr * sum_t g_t / (s_t + eps),   s_t = sqrt(v_hat_t),
    with v_hat_t the bias-corrected moving average of sigma_t^2 (what Adam's v tracks). Its
    RMS per element is lr * sqrt(sum_t sigma_t^2 / (s_t + eps)^2), and over n elements
        ||Delta|| ~ lr * sqrt(n * sum_t (sigma_t / (s_t + eps))^2).
    Limits: sigma >> eps gives lr * sqrt(n T) (Adam normalizes the noise to unit steps);
    sigma << eps gives lr * sqrt(n sum sigma^2) / eps (an SGD with step lr/eps). A gradient
    with a consistent sign would instead drift like lr * T * sqrt(n)."""
    g = _check_noise(grad_rms, lr, eps)
    _, beta2 = betas
    v, total = 0.0, 0.0
    for t, sigma in enumerate(g, start=1):
        v = beta2 * v + (1 - beta2) * sigma**2
        s = math.sqrt(v / (1 - beta2**t))
        total += (sigma / (s + eps)) ** 2
    return lr * math.sqrt(n_elements * total)


def _check_noise(grad_rms, lr, eps) -> np.ndarray:
    g = np.asarray(grad_rms, dtype=float)
    if np.any(g < 0) or not np.all(np.isfinite(g)):
        raise ValueError("grad_rms must be finite and non-negative")
    if not (lr > 0 and eps > 0):
        raise ValueError(f"lr and eps must be positive, got lr={lr!r}, eps={eps!r}")
    return g


def predicted_adam_drift(grad_rms: np.ndarray, *, lr: float, eps: float, n_elements: int,
                         betas: tuple[float, float] = ADAM_BETAS, replicas: int = 256, seed: int = 0) -> float:
    """Predicted ||b_k(T) - b_k(0)|| under Adam from the measured noise level and eps alone.

    The model: each of the n entries of b_k receives independent zero-mean Gaussian noise whose
    RMS at step t is the measured grad_rms[t]. We run Adam's exact update rule (bias-corrected
    moments, betas, eps) on that synthetic noise for `replicas` independent copies and return
    the root-mean-square drift norm. It refines `random_walk_drift` (same limits) by keeping
    Adam's per-element second moment, which lags a noise level that changes during training.
    A consistent gradient direction, which this model excludes, would drift ~sqrt(T) times
    further, so the comparison with the measured drift tests that the gradient is noise."""
    g = _check_noise(grad_rms, lr, eps)
    check_positive_int("n_elements", n_elements)
    beta1, beta2 = betas
    rng = np.random.default_rng(seed)
    m = np.zeros((replicas, n_elements))
    v = np.zeros((replicas, n_elements))
    p = np.zeros((replicas, n_elements))
    for t, sigma in enumerate(g, start=1):
        noise = sigma * rng.standard_normal((replicas, n_elements))
        m = beta1 * m + (1 - beta1) * noise
        v = beta2 * v + (1 - beta2) * noise * noise
        p -= lr * (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + eps)
    return float(np.sqrt((p**2).sum(axis=1).mean()))


def sgd_random_walk(grad_rms: np.ndarray, *, lr: float, momentum: float = 0.0, n_elements: int = 1) -> float:
    """The drift SGD (with momentum mu) gives a parameter whose gradient is uncorrelated noise of
    RMS sigma_t per entry: lr / (1 - mu) * sqrt(n * sum_t sigma_t^2), a random walk (it grows like
    sqrt(T)). A gradient with a consistent direction moves it up to sqrt(T) times further, and a real
    gradient is far larger than rounding noise: both make the SGD claim fail."""
    g = np.asarray(grad_rms, dtype=float)
    if g.size == 0 or np.any(g < 0) or not np.all(np.isfinite(g)):
        raise ValueError("grad_rms must be a non-empty array of finite, non-negative numbers")
    return lr / (1.0 - momentum) * math.sqrt(n_elements * float((g**2).sum()))
