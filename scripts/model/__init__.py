"""Model preparation: the tiny test model, a user's checkpoint, the ahead-of-time compile."""
