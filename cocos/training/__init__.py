"""Training utilities: retrieval metrics and the training loop."""
