"""Whether a result is right: comparison against the reference and the numerics policy."""
