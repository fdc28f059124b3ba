"""balancer (see DESIGN.md)."""
