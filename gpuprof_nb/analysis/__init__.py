"""Pure functions from model objects to frozen result dataclasses. No torch, IPython, I/O."""
