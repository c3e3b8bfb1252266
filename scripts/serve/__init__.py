"""A local TorchServe: start, stop, the client, the archive staging, what each TorchServe version enforces."""
