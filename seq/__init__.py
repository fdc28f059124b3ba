"""seq (see DESIGN.md)."""
