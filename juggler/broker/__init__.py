"""juggler/broker (see DESIGN.md)."""
