"""rpc/transport (see DESIGN.md)."""
