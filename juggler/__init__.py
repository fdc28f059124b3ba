"""juggler (see DESIGN.md)."""
