"""The `fusion-plan` command line: one module per subcommand in `cli/commands/`, views and reports."""
