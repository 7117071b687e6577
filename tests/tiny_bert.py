"""Tiny random BERT checkpoints with a real WordPiece vocabulary, saved as transformers saves them
(config.json, model.safetensors, tokenizer files), for the pipeline and sentence-transformers tests."""
import os

import torch
import transformers as T

WORDS = ("the a is in of and to my name john lives paris new york city weather today good bad great movie "
         "film i love this hate it was play run walk un sports politics about talk query passage what "
         "##ing ##s ##ed ##want , . ! ? :").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS))


def tokenizer(directory) -> "T.BertTokenizerFast":
    """HF's BertTokenizerFast over VOCAB, read from a vocab.txt written into `directory`."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(VOCAB) + "\n")
    return T.BertTokenizerFast.from_pretrained(str(directory))


def save(directory, class_name: str, name=None, labels=None, seed: int = 0, **config) -> str:
    """Save a random transformers `class_name` (e.g. "BertForMaskedLM") and its tokenizer under
    directory/name (default: the class name); returns that path.

    `labels` (a list of names) sets num_labels, id2label and label2id. Weights are drawn wider than
    BERT's 0.02 (initializer_range 0.2) so that predictions are spread out, not near-ties."""
    if labels is not None:
        config.update(id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    cfg = T.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=48, max_position_embeddings=64, initializer_range=0.2, **config)
    torch.manual_seed(seed)
    model = getattr(T, class_name)(cfg).eval()
    path = os.path.join(str(directory), name or class_name)
    model.save_pretrained(path)
    tokenizer(os.path.join(str(directory), "vocab")).save_pretrained(path)
    return path
