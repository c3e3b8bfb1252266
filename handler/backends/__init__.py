"""Model backends: token ids in, token ids out."""
