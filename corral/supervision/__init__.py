"""corral.supervision."""
