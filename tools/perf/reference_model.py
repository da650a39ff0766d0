"""Write the perf kit's reference model: a small random GPT-2 and a BPE tokenizer, offline.

    python tools/perf/reference_model.py OUT [--layers 4 --width 256 --vocab 2048]

The timing workload of `tools/perf/perf.py` and `tools/perf/trl_anchor.py --workload
reference`: 4 layers, n_embd 256, 4 heads, 256 positions, random init under seed 0 (3.75M
parameters); a byte-level BPE tokenizer of `--vocab` entries trained on CPython's pydoc topics
(in the standard library, so nothing is downloaded). It needs only torch, transformers and
tokenizers, and runs under transformers 4 and 5 alike (the TRL venv writes a tokenizer both
read).
"""

from __future__ import annotations

import argparse
import os


def pydoc_text() -> str:
    """CPython's pydoc topics as one text (the workload's prompts come from it too)."""
    import pydoc_data.topics as topics

    return "\n".join(topics.topics.values())


def write(out: str, layers: int = 4, width: int = 256, vocab: int = 2048) -> int:
    """Write the tokenizer and the model to `out`; return the parameter count."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    eos = "<|endoftext|>"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    text = pydoc_text()
    chunks = (text[i:i + 10_000] for i in range(0, len(text), 10_000))
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator(chunks, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[eos], initial_alphabet=alphabet))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos, bos_token=eos,
                                  unk_token=eos, pad_token=eos)
    tok.save_pretrained(out)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=width, n_head=4, n_positions=256,
                                       vocab_size=len(tok), bos_token_id=tok.eos_token_id,
                                       eos_token_id=tok.eos_token_id))
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    """Command line: write the reference model."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--vocab", type=int, default=2048)
    a = p.parse_args()
    print(a.out, write(a.out, a.layers, a.width, a.vocab))


if __name__ == "__main__":
    main()
