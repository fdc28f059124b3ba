"""rpc (see DESIGN.md)."""
