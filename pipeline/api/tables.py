"""A plain table (title, column names, text rows) shown in a notebook, a Markdown cell or a terminal.

The API's results (`pipeline.api.results`) describe themselves as `Table`s; `Table` renders them as HTML
(`_repr_html_`, Jupyter), Markdown (`_repr_markdown_`) and a rich table (`__rich__`, the console).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from rich.console import Group
from rich.table import Table as RichTable
from rich.text import Text


@dataclass(frozen=True)
class Table:
    """`rows` hold one text cell per column; `title` names the table."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def to_html(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                       for row in self.rows)
        return (f"<table><caption>{html.escape(self.title)}</caption><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>")

    def to_markdown(self) -> str:
        def cell(text: str) -> str:
            return text.replace("|", "\\|").replace("\n", " ") or "-"

        lines = [f"**{self.title}**", "", "| " + " | ".join(map(cell, self.columns)) + " |",
                 "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(map(cell, row)) + " |" for row in self.rows]
        return "\n".join(lines)

    def __rich__(self):
        table = RichTable(title=self.title)
        for column in self.columns:
            table.add_column(column, overflow="fold")
        for row in self.rows:
            table.add_row(*row)
        return table


def render_html(heading: str, tables: list[Table]) -> str:
    """`heading` (one line of text) above each table, as one HTML fragment."""
    return f"<div><p>{html.escape(heading)}</p>" + "".join(t.to_html() for t in tables) + "</div>"


def render_markdown(heading: str, tables: list[Table]) -> str:
    """`heading` above each table, as Markdown."""
    return "\n\n".join([heading, *(t.to_markdown() for t in tables)])


def render_rich(heading: str, tables: list[Table]):
    """A rich renderable: `heading`, then each table."""
    return Group(Text(heading), *(t.__rich__() for t in tables))
