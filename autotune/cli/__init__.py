"""The edge: Typer commands and Rich presentation. Nothing below imports from here."""
