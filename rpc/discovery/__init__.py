"""rpc/discovery (see DESIGN.md)."""
