"""What the studies and the pipeline both import: the recorder of claims and results, and the
reductions that judges use. It imports nothing else of keybias."""
