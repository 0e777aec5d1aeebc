"""The command line: ``cli`` and one module per subcommand."""
