"""corral.testing."""
