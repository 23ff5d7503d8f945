"""corral.registry."""
