"""fastbert's tokenizers: `BertTokenizer` (the C++ WordPiece core behind transformers'
BertTokenizerFast API), its `BatchEncoding`, and `AutoTokenizer` (BertTokenizer for WordPiece
checkpoints, transformers' fast tokenizer for the others).

Modules, imported one way (each only from those below it): auto -> bert -> pad -> encoding ->
alignment; bert -> files, options; everything -> fastbert._C.
"""
from fastbert.tokenizer.alignment import CharSpan, Encoding, TokenSpan
from fastbert.tokenizer.auto import AutoTokenizer
from fastbert.tokenizer.bert import BertTokenizer
from fastbert.tokenizer.encoding import BatchEncoding

__all__ = ["AutoTokenizer", "BatchEncoding", "BertTokenizer", "CharSpan", "Encoding", "TokenSpan"]
