"""corral: places applications on a fleet of machines and runs them."""

from corral._errors import CorralError

__all__ = ["CorralError", "__version__"]

__version__ = "0.1.0"
