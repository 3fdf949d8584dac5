"""How a study declares the columns of its tables: names grouped by their output class."""


def cols(**groups: str) -> dict[str, str]:
    """{'exact': 'a b c', 'f64': 'd'} -> {'a': 'exact', ..., 'd': 'f64'}."""
    out: dict[str, str] = {}
    for cls, names in groups.items():
        for name in names.split():
            if name in out:
                raise ValueError(f"column {name!r} declared twice")
            out[name] = cls
    return out
