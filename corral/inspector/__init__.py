"""corral.inspector."""
