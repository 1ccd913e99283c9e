__version__ = "0.1.0"

from . import core as _core  # first: sets the process up (OpenMP wait policy, heap) before torch loads; see the core chapter
