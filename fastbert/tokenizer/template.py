"""The post-processor's template: which special tokens go around one sequence and around a pair,
with their token type ids, read from tokenizer.json's "post_processor" as the tokenizers library
applies it (BertProcessing, RobertaProcessing, TemplateProcessing with one id per special token).

A template is a list of (id, type_id) pieces; id SEQ_A / SEQ_B stands for the first / second
sequence. The C++ core takes it as it is (fastbert._C.Tokenizer.set_template).
"""
from __future__ import annotations

SEQ_A, SEQ_B = -1, -2
KINDS = ("BertProcessing", "RobertaProcessing", "TemplateProcessing")


def supported(post_processor) -> bool:
    """Whether `post_processor` (tokenizer.json's, or None) is one the C++ core applies exactly."""
    if post_processor is None:
        return True
    if not isinstance(post_processor, dict) or post_processor.get("type") not in KINDS:
        return False
    if post_processor["type"] != "TemplateProcessing":
        return True
    specials = post_processor.get("special_tokens") or {}
    return all(isinstance(s, dict) and len(s.get("ids") or ()) == 1 for s in specials.values())


def _token(value, name: str, where: str):
    # BertProcessing / RobertaProcessing write ["[CLS]", 101]; the id may be left out (None)
    if isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], str):
        return value[0], value[1]
    raise ValueError(f"{where}: post_processor {name} must be [token, id], got {value!r}")


def build(post_processor, token_id, cls_token, sep_token, where: str = "post_processor"):
    """(single, pair) templates. token_id(str) -> int | None looks up a token whose id the
    post-processor does not give; None for post_processor means BERT's with cls_token / sep_token."""
    def lookup(token, given):
        if given is not None:
            return int(given)
        i = token_id(token) if token is not None else None
        return 0 if i is None else i  # as HF's BertTokenizerFast with a vocabulary missing [CLS]

    kind = post_processor.get("type") if isinstance(post_processor, dict) else None
    if post_processor is None or kind in ("BertProcessing", "RobertaProcessing"):
        if post_processor is None:
            cls, sep = (cls_token, None), (sep_token, None)
        else:
            cls = _token(post_processor.get("cls", (cls_token, None)), "cls", where)
            sep = _token(post_processor.get("sep", (sep_token, None)), "sep", where)
        c, s = lookup(*cls), lookup(*sep)
        if kind == "RobertaProcessing":  # <s> A </s></s> B </s>, every type id 0
            return [(c, 0), (SEQ_A, 0), (s, 0)], [(c, 0), (SEQ_A, 0), (s, 0), (s, 0), (SEQ_B, 0), (s, 0)]
        return [(c, 0), (SEQ_A, 0), (s, 0)], [(c, 0), (SEQ_A, 0), (s, 0), (SEQ_B, 1), (s, 1)]
    if kind != "TemplateProcessing":
        raise ValueError(f"{where}: post_processor type {kind!r} is not supported by fastbert's tokenizer "
                         f"(supported: {', '.join(KINDS)}); load it with transformers.AutoTokenizer")
    specials = post_processor.get("special_tokens") or {}

    def pieces(name):
        out = []
        for p in post_processor.get(name) or []:
            if not isinstance(p, dict) or len(p) != 1:
                raise ValueError(f"{where}: template piece {p!r} in {name!r} is not a Sequence or SpecialToken")
            (what, body), = p.items()
            type_id = int(body.get("type_id", 0))
            if what == "Sequence":
                seq = body.get("id")
                if seq not in ("A", "B"):
                    raise ValueError(f"{where}: template sequence {seq!r} in {name!r} must be 'A' or 'B'")
                out.append((SEQ_A if seq == "A" else SEQ_B, type_id))
            elif what == "SpecialToken":
                token = specials.get(body.get("id"))
                ids = token.get("ids") if isinstance(token, dict) else None
                if not ids or len(ids) != 1:
                    raise ValueError(f"{where}: template special token {body.get('id')!r} must have exactly one id "
                                     f"in special_tokens, got {ids!r}")
                out.append((int(ids[0]), type_id))
            else:
                raise ValueError(f"{where}: template piece {what!r} in {name!r} is not a Sequence or SpecialToken")
        return out

    return pieces("single"), pieces("pair")


def gaps(single, pair) -> tuple[tuple[int], tuple[int, int]]:
    """The special tokens before $A (single), and before $A and between $A and $B (pair): where
    the alignment's sequence ranges start."""
    def before(t, seq):
        return next(k for k, (i, _) in enumerate(t) if i == seq)
    a1, a2, b2 = before(single, SEQ_A), before(pair, SEQ_A), before(pair, SEQ_B)
    return (a1,), (a2, b2 - a2 - 1)


def specials(template) -> int:
    return sum(1 for i, _ in template if i >= 0)


def as_post_processor(single, pair, id_to_token) -> dict:
    """The TemplateProcessing post-processor (tokenizer.json's form) that builds `single` and `pair`
    again, whatever the special tokens are named later (transformers keeps a tokenizer's post-processor
    when add_special_tokens renames cls_token / sep_token)."""
    def pieces(t):
        return [{"Sequence": {"id": "A" if i == SEQ_A else "B", "type_id": type_id}} if i < 0
                else {"SpecialToken": {"id": id_to_token(i), "type_id": type_id}} for i, type_id in t]
    ids = {i for i, _ in single + pair if i >= 0}
    return {"type": "TemplateProcessing", "single": pieces(single), "pair": pieces(pair),
            "special_tokens": {id_to_token(i): {"id": id_to_token(i), "ids": [i], "tokens": [id_to_token(i)]}
                               for i in sorted(ids)}}
