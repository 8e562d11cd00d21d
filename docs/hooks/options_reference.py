"""mkdocs hook: the option reference (docs/options.md) generated from herd.config's dataclasses.

The page holds a marker, `<!-- options -->`; this hook replaces it with one table per
config section (every field: its flag, its default as a run gets it, its help text), so
the reference cannot drift from what `herd train` accepts.
"""
from __future__ import annotations

import dataclasses

MARKER = "<!-- options -->"


def cell(text: str) -> str:
    """Markdown-table-safe text: pipes, asterisks and brackets escaped (a `[...]` would be read as a
    link reference), no line breaks."""
    text = " ".join(str(text).split())
    for char in "|[]*":
        text = text.replace(char, "\\" + char)
    return text


def options_markdown() -> str:
    from herd.cli import default_text
    from herd.config import SECTIONS
    parts = []
    for section, cls in SECTIONS.items():
        parts += [f"## {section}", "", "| option | default | meaning |", "|---|---|---|"]
        for f in dataclasses.fields(cls):
            # default_text is --help's " [default: ...] [--algorithm=apex: ...]"; the table drops the brackets.
            default = default_text(f).strip().removeprefix("[default: ").replace("] [", "; ").removesuffix("]")
            choices = f.metadata.get("choices")
            meaning = f.metadata.get("help", "") + (f" (one of: {', '.join(map(str, choices))})" if choices else "")
            parts.append(f"| `--{f.name}` | {cell(default) or 'unset'} | {cell(meaning)} |")
        parts.append("")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs hook signature)
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, options_markdown())
