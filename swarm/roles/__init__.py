"""The roles a peer plays beside its networking: trainer (with its gate and batch wait), inference, validator."""
