"""Mutation testing: faulty backends and the score of how many of them a run catches."""
