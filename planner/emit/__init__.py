"""Launch-config emitters: Megatron-LM arguments, DeepSpeed JSON."""
from .deepspeed import deepspeed_config
from .megatron import megatron_args

__all__ = ["megatron_args", "deepspeed_config"]
