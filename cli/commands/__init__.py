"""`fusion-plan` subcommands: one module each, with `run(args)`; its parser is in cli/parsers/."""
