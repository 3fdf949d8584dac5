"""Rendering executed notebooks to HTML for readers (issue 14 owns the details)."""

from __future__ import annotations


def render_notebook_html(text: str, *, name: str, profile: str, device: str) -> str:
    """The HTML page of one executed notebook, given as nbformat JSON text."""
    import nbformat
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter().from_notebook_node(nbformat.reads(text, as_version=4))
    return html
