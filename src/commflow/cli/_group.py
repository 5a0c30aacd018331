"""The command groups of ``commflow``: ``-h`` for help everywhere, and an unknown command
answered with the closest known ones."""

from __future__ import annotations

import inspect
from difflib import get_close_matches

import typer
from typer.core import TyperGroup

CONTEXT = {"help_option_names": ["-h", "--help"]}
"""Context settings of every group (commands inherit them): ``-h`` is ``--help``."""

NCCL_TESTS_FLAG = "--nccl-tests"
"""``commflow bench --nccl-tests ...`` runs the ``nccl-tests`` command (its own flags)."""


def suggest(name: str, known: list[str]) -> list[str]:
    """Known commands close to ``name``: those it starts with or that start with it
    (``simulate`` -> ``sim``), then the closest spellings (``bnech`` -> ``bench``)."""
    prefixes = [k for k in known if name.startswith(k) or k.startswith(name)]
    close = get_close_matches(name, known, n=3, cutoff=0.5)
    return list(dict.fromkeys(prefixes + close))[:3]


def reflow(doc: str) -> str:
    """A command's docstring as help text: each paragraph's lines joined into one (rich keeps
    line breaks, so lines wrapped at the source's width would break again at the terminal's);
    blank lines, indented lines (examples) and ``[bold]`` headings kept as they are."""
    lines: list[str] = []
    for line in inspect.cleandoc(doc).splitlines():
        previous = lines[-1] if lines else ""
        if line and previous and not line.startswith((" ", "[")) \
                and not previous.startswith((" ", "[")):
            lines[-1] = f"{previous} {line}"
        else:
            lines.append(line)
    return "\n".join(lines)


def reflow_help(app: typer.Typer) -> None:
    """Set every command of ``app`` its docstring :func:`reflow`-ed as its help."""
    for info in app.registered_commands:
        info.help = reflow(info.help or inspect.getdoc(info.callback) or "")


class CommflowGroup(TyperGroup):
    """A typer group whose unknown commands raise a one-line usage error with suggestions,
    and which hands ``bench ... --nccl-tests ...`` to the ``nccl-tests`` command."""

    def resolve_command(
        self, ctx: typer.Context, args: list[str]
    ) -> tuple[str | None, object, list[str]]:
        name = args[0] if args else ""
        if name == "bench" and NCCL_TESTS_FLAG in args[1:]:
            rest = [a for a in args[1:] if a != NCCL_TESTS_FLAG]
            return name, self.get_command(ctx, "nccl-tests"), rest
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            known = [c for c in self.list_commands(ctx) if not self.get_command(ctx, c).hidden]
            close = suggest(name, known)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            ctx.fail(f"no command {name!r}{hint}")
        return super().resolve_command(ctx, args)
