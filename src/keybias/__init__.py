"""keybias: the key bias of multi-head attention, proved redundant, measured and removed.

`from keybias import strip_key_bias, fold_value_bias` loads the surgery tool on first use, so
`import keybias` itself stays light (no torch import).
"""

_LAZY = {"strip_key_bias", "fold_value_bias"}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        from keybias import surgery

        return getattr(surgery, name)
    raise AttributeError(f"module 'keybias' has no attribute {name!r}")
