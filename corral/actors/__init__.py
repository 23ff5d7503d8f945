"""corral.actors."""
