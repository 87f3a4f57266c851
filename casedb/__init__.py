"""casedb: real operator cases from real models, run on any PyTorch backend against a CPU reference."""

__version__ = "0.1.0"
