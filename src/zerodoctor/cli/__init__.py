"""The command line: `main(argv) -> int`, one module per command. The only place that prints or exits."""
