"""LoRA adapters on one base model: reading and checking PEFT adapters (`adapters`). Requests name
them (handler/api/), the scheduler bounds how many run at once, and the backends apply them (hf
through `peft`, nxdi through NxD Inference)."""

# An adapter's name: it comes back in responses (OpenAI `model`) and in /v1/models.
ADAPTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
