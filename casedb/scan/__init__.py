"""Scanning models on the meta device: recipes, inputs, recording, configs, the scan report."""
