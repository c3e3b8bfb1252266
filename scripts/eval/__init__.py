"""`make eval`: lm-eval against a served model, and the comparison of two runs."""
