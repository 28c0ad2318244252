"""`python -m mlgo.cli`: how the service and the tests start the command."""

from mlgo.cli import main

main()
