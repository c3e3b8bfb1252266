"""Mirrors the constants of src/neuronx_distributed_inference/utils/constants.py (SDK 2.28
commit cd3abf3) that a serving backend may read. The real MODEL_TYPES also lists gpt_oss,
llama4, mllama, mixtral, pixtral, dbrx, qwen2_vl, qwen3_moe, qwen3_vl: the fake has only the
dense text families below. There is no "mistral" entry (and no models/mistral package) at
SDK 2.28: vLLM's Neuron loader serves MistralForCausalLM with NeuronLlamaForCausalLM."""

from neuronx_distributed_inference.models.llama.modeling_llama import NeuronLlamaForCausalLM
from neuronx_distributed_inference.models.qwen2.modeling_qwen2 import NeuronQwen2ForCausalLM
from neuronx_distributed_inference.models.qwen3.modeling_qwen3 import NeuronQwen3ForCausalLM

CONTEXT_ENCODING_MODEL = "context_encoding_model"
TOKEN_GENERATION_MODEL = "token_generation_model"
BASE_COMPILER_WORK_DIR = "/tmp/nxd_model/"
CTX_ENC_MODEL_COMPILER_WORK_DIR = BASE_COMPILER_WORK_DIR + CONTEXT_ENCODING_MODEL + "/"
TKN_GEN_MODEL_COMPILER_WORK_DIR = BASE_COMPILER_WORK_DIR + TOKEN_GENERATION_MODEL + "/"

MODEL_TYPES = {
    "llama": {"causal-lm": NeuronLlamaForCausalLM},
    "qwen2": {"causal-lm": NeuronQwen2ForCausalLM},
    "qwen3": {"causal-lm": NeuronQwen3ForCausalLM},
}
