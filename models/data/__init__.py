"""Datasets the model families train on; each returns a models.TensorDataset."""
