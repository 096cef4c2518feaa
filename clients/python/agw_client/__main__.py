"""`python -m agw_client ...` is the `agw` command line."""

from agw_client.cli.main import main

main()
