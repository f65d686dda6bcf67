"""Model architectures (ModelSpec) with exact parameter counts, and loaders for the built-in zoo,
our YAML files and Hugging Face config.json files."""
from .errors import ModelSpecError
from .hf_config import from_hf_config, supported_model_types
from .loaders import DEFAULT_MODEL, get_model, list_models, load_model, load_model_file
from .spec import LayerParams, MLASpec, ModelSpec, MoESpec, RopeScalingSpec

__all__ = [
    "DEFAULT_MODEL",
    "LayerParams",
    "MLASpec",
    "ModelSpec",
    "ModelSpecError",
    "MoESpec",
    "RopeScalingSpec",
    "from_hf_config",
    "get_model",
    "list_models",
    "load_model",
    "load_model_file",
    "supported_model_types",
]
