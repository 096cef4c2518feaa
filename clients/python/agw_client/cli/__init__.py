"""The `agw` command line (see `agw_client.cli.main`)."""
