"""The training study's model, data and optimizers: a tiny ViT on scikit-learn's digits.

Each attention layer's packed bias `in_proj_bias = [b_q; b_k; b_v]` is split into three
tensors (`split_in_proj_bias`), so the key bias can either be a trained parameter (kept) or a
zero buffer that no optimizer ever sees (removed). Everything else, the seed, the initial
weights, the data order, is shared between a kept and a removed run.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from keybias.studies.params import check_choice, check_positive_int

OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "adamw", "adamw_bias_decay")
OPTIMIZER_LABELS = {
    "sgd": "SGD",
    "sgd_momentum": "SGD + momentum",
    "adam": "Adam",
    "adamw": "AdamW (no wd on biases)",
    "adamw_bias_decay": "AdamW (wd on biases)",
}
TRAIN_DTYPES = ("float32", "bfloat16")
PATCH_SIZES = (1, 2, 4, 8)
N_CLASSES = 10
ADAM_BETAS = (0.9, 0.999)
DEFAULT_EPS = 1e-8



# ----------------------------------------------------------------------------- validation


def check_model_config(*, embed_dim: int, num_heads: int, num_layers: int, patch: int) -> None:
    """Raise ValueError for a model that cannot be built, before any work."""
    for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads), ("num_layers", num_layers)):
        check_positive_int(name, value)
    check_choice("patch", patch, PATCH_SIZES)
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")


def check_train_config(*, optimizer: str, dtype: str, steps: int, batch_size: int, eps: float) -> None:
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_choice("dtype", dtype, TRAIN_DTYPES)
    check_positive_int("steps", steps)
    check_positive_int("batch_size", batch_size)
    if not (isinstance(eps, int | float) and eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a positive number, got {eps!r}")


# ----------------------------------------------------------------------------- data


def load_digits_split(test_fraction: float = 0.2, split_seed: int = 0) -> dict[str, torch.Tensor]:
    """scikit-learn's 8x8 digits (shipped with the package): a fixed random split (seeded) into
    train and test, pixels standardized with the training set's mean and standard deviation."""
    from sklearn.datasets import load_digits

    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(split_seed))
    n_test = int(round(test_fraction * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    mean, std = x[train].mean(), x[train].std()  # one scalar each, from the training images
    x = (x - mean) / std
    return {"x_train": x[train], "y_train": y[train], "x_test": x[test], "y_test": y[test]}


def batch_order(n_train: int, batch_size: int, steps: int, seed: int) -> list[torch.Tensor]:
    """Minibatch indices for `steps` steps: a fresh permutation each epoch, from `seed` alone,
    so paired runs see exactly the same batches in the same order."""
    check_positive_int("batch_size", batch_size)
    check_positive_int("steps", steps)
    if batch_size > n_train:
        raise ValueError(f"batch_size={batch_size} exceeds the {n_train} training images")
    gen = torch.Generator().manual_seed(10_000 + seed)
    batches: list[torch.Tensor] = []
    while len(batches) < steps:
        perm = torch.randperm(n_train, generator=gen)
        for start in range(0, n_train - batch_size + 1, batch_size):
            batches.append(perm[start : start + batch_size])
            if len(batches) == steps:
                break
    return batches


# ----------------------------------------------------------------------------- model


def _refresh_in_proj_bias(module, args):
    # The attention reads module.in_proj_bias; rebuild it from the three parts each call,
    # so gradients flow to b_q, b_v (and b_k when it is a parameter).
    module.in_proj_bias = torch.cat([module.b_q, module.b_k, module.b_v])


def split_in_proj_bias(mha: nn.MultiheadAttention, *, keep_key_bias: bool, key_bias_init: float = 0.0,
                       generator: torch.Generator | None = None) -> None:
    """Replace the packed parameter `in_proj_bias = [b_q; b_k; b_v]` by three tensors.

    `b_q` and `b_v` become parameters. `b_k` becomes a parameter when `keep_key_bias`, and
    otherwise a zero buffer: it is not a parameter, so no optimizer holds it or any state for
    it, and it stays exactly zero (removal is exact, not a hook that zeroes a gradient).
    The packed tensor is rebuilt by concatenation before every forward call, so the
    attention computes exactly what the packed parameter would hold.

    The kept and removed models compute the same function in exact arithmetic for any b_k:
    scores q.(k_j + b_k) = q.k_j + q.b_k shift every key of one query by the same amount,
    and softmax(s + c) = softmax(s). With `key_bias_init > 0` the kept b_k starts at
    N(0, key_bias_init^2) entries (drawn from `generator`), else at PyTorch's default 0.
    """
    e = mha.embed_dim
    packed = mha.in_proj_bias.detach().clone()
    del mha.in_proj_bias
    mha.b_q = nn.Parameter(packed[:e].clone())
    mha.b_v = nn.Parameter(packed[2 * e :].clone())
    if keep_key_bias:
        init = packed[e : 2 * e].clone()
        if key_bias_init > 0:
            init = key_bias_init * torch.randn(e, generator=generator)
        mha.b_k = nn.Parameter(init)
    else:
        mha.register_buffer("b_k", torch.zeros(e))
    mha.register_forward_pre_hook(_refresh_in_proj_bias)
    _refresh_in_proj_bias(mha, ())


class TinyViT(nn.Module):
    """Patch embedding, learned positions, pre-norm encoder layers, mean pooling, linear head."""

    def __init__(self, *, embed_dim: int, num_heads: int, num_layers: int, patch: int):
        super().__init__()
        self.patch = patch
        n_tokens = (8 // patch) ** 2
        self.embed = nn.Linear(patch * patch, embed_dim)
        self.pos = nn.Parameter(0.02 * torch.randn(n_tokens, embed_dim))
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                embed_dim, num_heads, dim_feedforward=2 * embed_dim, dropout=0.0,
                activation="gelu", batch_first=True, norm_first=True,
            )
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, N_CLASSES)

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        b, p = images.shape[0], self.patch
        x = images.reshape(b, 8 // p, p, 8 // p, p).permute(0, 1, 3, 2, 4).reshape(b, -1, p * p)
        return self.embed(x) + self.pos

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.tokens(images)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))


def attention_modules(model: nn.Module) -> list[nn.MultiheadAttention]:
    return [m for m in model.modules() if isinstance(m, nn.MultiheadAttention)]


def build_model(seed: int, *, embed_dim: int, num_heads: int, num_layers: int, patch: int,
                keep_key_bias: bool, key_bias_init: float = 0.0) -> TinyViT:
    """The tiny ViT with the key bias kept (a parameter) or removed (a zero buffer).

    The initial weights depend on `seed` only: a kept and a removed model with the same seed
    have identical weights, and identical b_q, b_v (all zero, PyTorch's default), so with
    `key_bias_init == 0` they are the same function bit for bit at step 0."""
    check_model_config(embed_dim=embed_dim, num_heads=num_heads, num_layers=num_layers, patch=patch)
    if key_bias_init < 0:
        raise ValueError(f"key_bias_init must be >= 0, got {key_bias_init!r}")
    torch.manual_seed(seed)
    model = TinyViT(embed_dim=embed_dim, num_heads=num_heads, num_layers=num_layers, patch=patch)
    gen = torch.Generator().manual_seed(20_000 + seed)
    for mha in attention_modules(model):
        split_in_proj_bias(mha, keep_key_bias=keep_key_bias, key_bias_init=key_bias_init, generator=gen)
    model.train()  # never switched to eval mode: see module docstring
    return model


# ----------------------------------------------------------------------------- optimizers


def _is_bias_like(name: str, param: torch.Tensor) -> bool:
    """Biases and LayerNorm gains: every 1-D parameter."""
    return param.ndim < 2


def make_optimizer(model: nn.Module, name: str, *, lr: float, momentum: float = 0.9,
                   weight_decay: float = 0.0, eps: float = DEFAULT_EPS) -> torch.optim.Optimizer:
    """Build one of OPTIMIZERS over the model's parameters (a removed b_k is a buffer, so it
    is in no parameter group).

    - sgd: plain SGD; sgd_momentum: SGD with `momentum`;
    - adam: Adam(betas=(0.9, 0.999), eps) without weight decay;
    - adamw: AdamW with decoupled `weight_decay` on matrices only (no decay on biases/norms);
    - adamw_bias_decay: AdamW with `weight_decay` on every parameter, biases included.
    """
    check_choice("optimizer", name, OPTIMIZERS)
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    params = list(model.named_parameters())
    foreach = False  # the same per-element arithmetic for every parameter layout
    if name == "sgd":
        return torch.optim.SGD([p for _, p in params], lr=lr, foreach=foreach)
    if name == "sgd_momentum":
        return torch.optim.SGD([p for _, p in params], lr=lr, momentum=momentum, foreach=foreach)
    if name == "adam":
        return torch.optim.Adam([p for _, p in params], lr=lr, betas=ADAM_BETAS, eps=eps, foreach=foreach)
    if name == "adamw":
        decay = [p for n, p in params if not _is_bias_like(n, p)]
        no_decay = [p for n, p in params if _is_bias_like(n, p)]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=ADAM_BETAS, eps=eps, foreach=foreach)
    return torch.optim.AdamW([p for _, p in params], lr=lr, betas=ADAM_BETAS, eps=eps,
                             weight_decay=weight_decay, foreach=foreach)


def optimizer_lr(name: str, *, lr_sgd: float, lr_adam: float, momentum: float = 0.9) -> float:
    """Learning rate per optimizer: lr_sgd for SGD, lr_sgd * (1 - momentum) for SGD with
    momentum (the same effective step, lr / (1 - momentum), as plain SGD), lr_adam otherwise."""
    check_choice("optimizer", name, OPTIMIZERS)
    if name == "sgd":
        return lr_sgd
    if name == "sgd_momentum":
        return lr_sgd * (1.0 - momentum)
    return lr_adam
