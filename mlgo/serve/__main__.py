"""The policy service's own entry point, which `mlgo-cc` starts on demand
(mlgo.serve.client.launch_service): the service without the command line's imports. Its
options are `mlgo serve`'s; a failure is one line on stderr and exit 2, as there."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlgo.errors import MlgoError
from mlgo.runtime.messages import WHOLE_LINE, error_line
from mlgo.serve.server import run_service


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m mlgo.serve", description=__doc__)
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--idle-exit", type=float, default=0.0)
    parser.add_argument("--policy", type=Path, action="append", required=True)
    args = parser.parse_args()
    try:
        run_service(args.policy, args.backend, args.socket, args.idle_exit)
    except (MlgoError, OSError) as e:  # as `mlgo` catches them: anything else is a bug
        print(f"error: {error_line(e, WHOLE_LINE)}", file=sys.stderr, flush=True)
        sys.exit(2)


main()
