"""mkdocs hook: the option reference (docs/options.md) generated from herd.config's dataclasses.

The page holds a marker, `<!-- options -->`; this hook replaces it with one table per
config section (every field: its flag, its default as a run gets it, its help text), so
the reference cannot drift from what `herd train` accepts.
"""
from __future__ import annotations

import dataclasses

MARKER = "<!-- options -->"


def cell(text: str) -> str:
    """Markdown-table-safe text: pipes escaped, no line breaks."""
    return " ".join(str(text).split()).replace("|", "\\|")


def options_markdown() -> str:
    from herd.cli import default_text
    from herd.config import SECTIONS
    parts = []
    for section, cls in SECTIONS.items():
        parts += [f"## {section}", "", "| option | default | meaning |", "|---|---|---|"]
        for f in dataclasses.fields(cls):
            default = default_text(f).strip()
            default = default[len("[default: "):-1] if default.startswith("[default: ") and default.count("[") == 1 else default
            choices = f.metadata.get("choices")
            meaning = f.metadata.get("help", "") + (f" (one of: {', '.join(map(str, choices))})" if choices else "")
            parts.append(f"| `--{f.name}` | {cell(default) or 'unset'} | {cell(meaning)} |")
        parts.append("")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs hook signature)
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, options_markdown())
