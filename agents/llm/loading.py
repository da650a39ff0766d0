"""Loading a causal LM for a policy: dtype, 4-bit quantisation, LoRA and dropout settings."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
from dataclasses import dataclass, field

import torch
from torch import nn

from cory_common.checks import meta
from cory_common.files import check_hub_name
from cory_common.pretrained import resolve_model


@dataclass
class LoraSettings:
    """LoRA hyper-parameters; target_modules None means peft's default for the architecture."""

    r: int = field(default=16, metadata=meta("LoRA rank: the adapters' inner width"))
    alpha: int = field(default=32, metadata=meta("LoRA alpha: the update is scaled by alpha / r"))
    dropout: float = field(default=0.05, metadata=meta("dropout on the adapters' input"))
    target_modules: list[str] | None = field(default=None, metadata=meta(
        "modules that get adapters, comma list (none: peft's default for the architecture)"))

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        """Raise ValueError naming a setting LoRA cannot take."""
        for name in ("r", "alpha"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LoraSettings.{name} must be a positive integer, got "
                                 f"{value!r}")
        if not (isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1):
            raise ValueError(f"LoraSettings.dropout must be in [0, 1), got {self.dropout!r}")


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability in the model to 0 (PPO ratios must be deterministic)."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):  # Llama-style attention
            m.attention_dropout = 0.0


def check_4bit(lora) -> None:
    """Fail early (before any weight is loaded) when 4-bit loading cannot work here."""
    if lora is None:
        raise ValueError("load_in_4bit=True needs LoRA (pass lora=LoraSettings(...)).")
    if not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
        raise RuntimeError("load_in_4bit=True needs a CUDA GPU and bitsandbytes "
                           "(`pip install cory[gpu]`); use full precision on this machine.")


def load_lm(name_or_path, load_in_4bit, device, dtype, hf_kwargs):
    """AutoModelForCausalLM.from_pretrained with the right dtype / quantization arguments."""
    import transformers

    name_or_path = resolve_model(name_or_path)  # a short name or a GGUF file: its folder
    check_hub_name("model", name_or_path)
    was_on = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bars: ours stay
    try:
        return _load_lm(name_or_path, load_in_4bit, device, dtype, hf_kwargs)
    finally:
        if was_on:
            transformers.utils.logging.enable_progress_bar()


def _load_lm(name_or_path, load_in_4bit, device, dtype, hf_kwargs):
    import transformers
    from transformers import AutoModelForCausalLM

    kw = dict(hf_kwargs)
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    if load_in_4bit:
        from transformers import BitsAndBytesConfig

        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
        kw["device_map"] = {"": device if device is not None else torch.cuda.current_device()}
        kw[dtype_key] = dtype or torch.bfloat16
    elif dtype is not None:
        kw[dtype_key] = dtype
    lm = AutoModelForCausalLM.from_pretrained(name_or_path, **kw)
    if device is not None and not load_in_4bit:
        lm.to(device)
    return lm


def lora_config(lora):
    """peft LoraConfig for a causal LM from our settings (a peft config passes through)."""
    from peft import LoraConfig

    if not isinstance(lora, LoraSettings):
        return lora

    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=lora.target_modules, bias="none", task_type="CAUSAL_LM")


def read_adapter(path: str):
    """A PEFT adapter folder's (LoraConfig, weights), naming what is missing."""
    from peft import PeftConfig
    from peft.utils import load_peft_weights

    if not os.path.exists(os.path.join(path, "adapter_config.json")):
        raise ValueError(f"adapter folder {path!r} has no adapter_config.json (save it with "
                         f"peft's save_pretrained)")
    return PeftConfig.from_pretrained(path), load_peft_weights(path)


def write_policy(policy, tmp: str) -> None:
    """Write a policy's weight files (adapter or full LM, value head, policy.json) into tmp."""
    from safetensors.torch import save_file, save_model

    meta = {"kind": "lora" if policy.is_lora else "full", "adapter_name": policy.adapter_name}
    if policy.is_lora:
        from peft import get_peft_model_state_dict

        sd = get_peft_model_state_dict(policy.model, adapter_name=policy.adapter_name)
        save_file({k: v.detach().contiguous() for k, v in sd.items()},
                  os.path.join(tmp, "adapter.safetensors"))
        cfg = policy.model.peft_config[policy.adapter_name]
        tm = cfg.target_modules
        meta["lora"] = {"r": cfg.r, "alpha": cfg.lora_alpha,
                        "target_modules": tm if isinstance(tm, str) else sorted(tm)}
    else:
        save_model(policy.model, os.path.join(tmp, "model.safetensors"))
    save_file({k: v.detach().contiguous() for k, v in policy.value_head.state_dict().items()},
              os.path.join(tmp, "value_head.safetensors"))
    with open(os.path.join(tmp, "policy.json"), "w") as f:
        json.dump(meta, f)


def read_policy(policy, path: str) -> None:
    """Load the files `write_policy` wrote into `policy`, in place."""
    from safetensors.torch import load_file, load_model

    with open(os.path.join(path, "policy.json")) as f:
        kind = json.load(f)["kind"]
    if kind != ("lora" if policy.is_lora else "full"):
        raise ValueError(f"{path} holds a {kind} checkpoint, this policy is not")
    if policy.is_lora:
        from peft import set_peft_model_state_dict

        sd = load_file(os.path.join(path, "adapter.safetensors"), device=str(policy.device))
        res = set_peft_model_state_dict(policy.model, sd, adapter_name=policy.adapter_name)
        mine = f".{policy.adapter_name}."
        bad = [k for k in res.unexpected_keys if "lora_" in k]
        bad += [k for k in res.missing_keys if "lora_" in k and mine in k]
        if bad:
            raise ValueError(f"adapter checkpoint does not match this model: {bad[:3]}")
        policy._restore_grad()
    else:
        load_model(policy.model, os.path.join(path, "model.safetensors"),
                   device=str(policy.device))
    vh = load_file(os.path.join(path, "value_head.safetensors"), device=str(policy.device))
    policy.value_head.load_state_dict(vh)


def cache_kwarg(model: nn.Module) -> str:
    """Name of the KV-cache argument: `cache` in transformers >= 5.2x, else `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


# ------------------------------------------------------------------------------- checks
def model_positions(folder) -> int | None:
    """The positions a local model folder's config.json allows (None: unknown or not local)."""
    return config_positions(_config(folder))


def config_positions(config) -> int | None:
    """The positions a model config (a dict or a transformers config) allows, None if unknown."""
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    for key in ("n_positions", "max_position_embeddings", "n_ctx"):
        if isinstance(get(key), int):
            return get(key)
    return None


def _config(folder) -> dict:
    """A local folder's config.json ({} when absent or unreadable)."""
    path = os.path.join(os.path.expanduser(str(folder)), "config.json") \
        if isinstance(folder, (str, os.PathLike)) else ""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def check_weights(folder, what: str) -> None:
    """Raise ValueError naming the folder and file when a local folder's safetensors weights
    cannot be read (reads the headers only)."""
    if not isinstance(folder, (str, os.PathLike)) or not os.path.isdir(os.path.expanduser(
            str(folder))):
        return
    from safetensors import safe_open

    root = os.path.expanduser(str(folder))
    for name in sorted(os.listdir(root)):
        if name.endswith(".safetensors"):
            try:
                with safe_open(os.path.join(root, name), framework="pt") as f:
                    f.keys()
            except Exception as err:
                raise ValueError(f"{what}={str(folder)!r}: {name} cannot be read ({err}); "
                                 f"the folder's weights are damaged or incomplete") from None


def check_adapter_base(adapter, base, what: str) -> None:
    """Raise ValueError naming the adapter when its LoRA matrices do not fit the base model's
    sizes (an adapter trained on another base); reads headers and config.json only."""
    root = os.path.expanduser(str(adapter))
    file = os.path.join(root, "adapter_model.safetensors")
    config = _config(base)
    if not os.path.isfile(file) or not config:
        return
    from safetensors import safe_open

    sizes = {v for v in config.values() if isinstance(v, int) and not isinstance(v, bool)}
    hidden = config.get("hidden_size", config.get("n_embd"))
    if isinstance(hidden, int):
        heads, kv = config.get("num_attention_heads", config.get("n_head")), \
            config.get("num_key_value_heads")
        sizes |= {3 * hidden, 4 * hidden}  # fused QKV and the default MLP width
        if isinstance(heads, int) and isinstance(kv, int) and heads:
            sizes.add(hidden // heads * kv)
    try:
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                shape = f.get_slice(key).get_shape()
                dim = shape[-1] if "lora_A" in key else shape[0] if "lora_B" in key else None
                if dim is not None and dim not in sizes:
                    raise ValueError(f"{what}={str(adapter)!r} does not fit the base model "
                                     f"{str(base)!r}: its {key} has size {dim}, which the "
                                     f"base (hidden size {hidden}) has nowhere; was it trained "
                                     f"on another base?")
    except ValueError:
        raise
    except Exception as err:
        raise ValueError(f"{what}={str(adapter)!r}: adapter_model.safetensors cannot be read "
                         f"({err})") from None
