"""Model building blocks: projections (linear.py chooses each one's layer), norm, rotary."""
