"""The command line (Typer). The library never imports this package."""
