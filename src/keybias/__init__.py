"""keybias: the key bias of multi-head attention, proved redundant, measured and removed."""
