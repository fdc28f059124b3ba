"""rpc/plugins (see DESIGN.md)."""
