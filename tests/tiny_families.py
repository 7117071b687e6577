"""Small random configs of every family fastbert runs, for tests that go over all of them."""
import transformers as T

SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
ROPE = dict(vocab_size=99, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            max_position_embeddings=64)
CONFIGS = {
    "bert": lambda: T.BertConfig(**SMALL),
    "roberta": lambda: T.RobertaConfig(**dict(SMALL, pad_token_id=1, max_position_embeddings=66)),
    "distilbert": lambda: T.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                             max_position_embeddings=64, dropout=0.0, attention_dropout=0.0),
    "electra": lambda: T.ElectraConfig(**dict(SMALL, embedding_size=16)),
    "albert": lambda: T.AlbertConfig(**dict(SMALL, embedding_size=16)),
    "deberta-v2": lambda: T.DebertaV2Config(**SMALL, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                            position_buckets=8, max_relative_positions=20,
                                            position_biased_input=False),
    "mpnet": lambda: T.MPNetConfig(**SMALL),
    "modernbert": lambda: T.ModernBertConfig(**ROPE, local_attention=8, pad_token_id=0, bos_token_id=1,
                                             eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                             global_attn_every_n_layers=3),
    "nomic_bert": lambda: T.NomicBertConfig(**ROPE, type_vocab_size=2,
                                            rope_parameters={"rope_type": "default", "rope_theta": 1000.0}),
}


# DeBERTa-v2/v3 variants (tests/models/test_deberta.py goes over all of them; pipelines use "v3")
DEBERTA_V2_BASE = dict(SMALL, num_labels=3, relative_attention=True)
DEBERTA_V2_VARIANTS = {   # every span (position_buckets or max_relative_positions) is shorter than 48 tokens
    "v3": dict(pos_att_type=["p2c", "c2p"], position_buckets=8, max_relative_positions=20, share_att_key=True,
               norm_rel_ebd="layer_norm", position_biased_input=False),
    "v2-clamped": dict(pos_att_type="c2p|p2c", max_relative_positions=12, type_vocab_size=2),
    "c2p-factorised": dict(pos_att_type=["c2p"], position_buckets=6, max_relative_positions=30, embedding_size=24,
                           position_biased_input=False),
    "p2c-own-proj": dict(pos_att_type=["p2c"], position_buckets=10, max_relative_positions=40,
                         norm_rel_ebd="layer_norm", legacy=False),
    "absolute-only": dict(relative_attention=False, pos_att_type=["p2c", "c2p"]),
    # transformers' own model tests use this one: no relative term, plain attention at scale 1
    "no-terms": dict(relative_attention=False, pos_att_type="None"),
    "relative-no-terms": dict(pos_att_type="None", position_buckets=8),   # rel_embeddings there, unused
}


def deberta_v2_config(variant, **extra):
    return T.DebertaV2Config(**{**DEBERTA_V2_BASE, **DEBERTA_V2_VARIANTS[variant], **extra})
