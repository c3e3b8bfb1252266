"""The capacity planner (`make plan`)."""
