"""The `mlgo` command: one module per command group, each command a few lines that parse
its options, call the library and print. This module registers them and turns a user's
error into one line."""

from __future__ import annotations

import sys
from typing import NoReturn

import click
import typer
from rich.markup import escape

from mlgo.cli import corpus, decisions, programs, serve, ship, train
from mlgo.cli.options import err
from mlgo.errors import USER_ERRORS
from mlgo.runtime.messages import WHOLE_LINE, error_line
from mlgo.xla.cli import xla_app

app = typer.Typer(
    help="ML-guided compiler heuristics: corpora, traces and policies for "
    "LLVM's inliner and register allocator.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command()(corpus.doctor)
app.add_typer(corpus.app, name="corpus")
app.add_typer(xla_app, name="xla")
app.add_typer(decisions.app, name="decisions")
app.command()(train.collect)
app.command()(train.train_command())
app.command("eval")(train.eval_cmd)
app.command()(train.calibrate)
app.command()(ship.export)
app.command()(train.report)
app.command()(programs.build)
app.command()(serve.serve)
app.command()(serve.status)
app.command()(serve.channel)
app.command()(serve.flags)
app.command("install-wrappers")(serve.install_wrappers)
app.command()(serve.stop)
app.command()(programs.demo)
app.command()(programs.tune)


def _fail(message: str, code: int) -> NoReturn:
    """One line on stderr, then exit CODE: what a user needs, no traceback or usage box."""
    first = message.splitlines()[0] if message.strip() else "failed"
    err.print(f"[red]error:[/red] {escape(first)}", highlight=False)
    sys.exit(code)


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        e.show()  # the help text, not an error
        sys.exit(e.exit_code)
    except click.UsageError as e:  # a bad option or value, found at parse time
        where = e.ctx.command_path if e.ctx else "mlgo"
        _fail(f"{where}: {e.format_message()}", e.exit_code)
    except click.ClickException as e:
        _fail(e.format_message(), e.exit_code)
    except click.Abort:
        _fail("aborted", 1)
    except USER_ERRORS as e:  # our messages end with where to look (a log): keep it
        _fail(error_line(e, WHOLE_LINE), 2)
    sys.exit(code if isinstance(code, int) else 0)
