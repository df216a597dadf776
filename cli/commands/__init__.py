"""`fusion-plan` subcommands: one module each, with `add_parser(subparsers)` and `run(args)`."""
