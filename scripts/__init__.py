"""The project's commands, by area; run as `python -m scripts.<area>.<module>` from the repository root."""
