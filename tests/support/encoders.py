"""Tiny random encoder checkpoints written by sentence-transformers' own save (so modules.json, the pooling config and
a cross-encoder's activation are real): BERT and XLM-RoBERTa embedding models, and cross-encoders, each with a small
WordPiece tokenizer; XLM-R's uses <s> <pad> </s> ids, so its positions start after pad id 1 as the real ones do."""
from __future__ import annotations

from pathlib import Path

import torch

WORDS = ("the a of to and in is it that for on with as was he she they what where capital city country paris france "
         "rome italy quick brown fox jumps over lazy dog cat sat mat river bank money").split()
CHARS = list("abcdefghijklmnopqrstuvwxyz.,!?'0123456789")
SHAPE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _tokenizer(folder: Path, family: str):
    from transformers import BertTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if family == "bert" else ["<s>", "<pad>", "</s>", "<unk>",
                                                                                     "<mask>"]
    vocab = special + list(WORDS) + CHARS + ["##" + c for c in CHARS]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    if family == "bert":
        return BertTokenizerFast(vocab_file=str(folder / "vocab.txt")), len(vocab)
    # XLM-R's tokenizer gives no token types: a pair is told apart by its separators alone
    return BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), cls_token="<s>", sep_token="</s>",
                             pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
                             model_input_names=["input_ids", "attention_mask"]), len(vocab)


def _transformers_dir(folder: Path, family: str, cross: bool, seed: int) -> Path:
    from transformers import (BertConfig, BertForSequenceClassification, BertModel, XLMRobertaConfig,
                              XLMRobertaForSequenceClassification, XLMRobertaModel)

    tok, vocab_size = _tokenizer(folder / "vocab", family)
    torch.manual_seed(seed)
    if family == "bert":
        config = BertConfig(vocab_size=vocab_size, max_position_embeddings=64, num_labels=1, **SHAPE)
        model = (BertForSequenceClassification if cross else BertModel)(config)
    else:
        config = XLMRobertaConfig(vocab_size=vocab_size, max_position_embeddings=66, type_vocab_size=1, num_labels=1,
                                  pad_token_id=1, bos_token_id=0, eos_token_id=2, **SHAPE)
        model = (XLMRobertaForSequenceClassification if cross else XLMRobertaModel)(config)
    with torch.no_grad():  # random norms and biases, and weights large enough that the texts' rows mix and scores
        for name, p in model.named_parameters():  # spread: a mistaken norm, bias, mask or position shows
            if p.dim() == 1:
                p.normal_(1.0 if name.endswith("LayerNorm.weight") else 0.0, 0.3)
            else:
                p.normal_(0.0, 0.3)
    out = folder / "transformers"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def make_bi_encoder(folder: Path, family: str, pooling: str, normalize: bool, seed: int = 0) -> Path:
    """A sentence-transformers embedding model: `pooling` cls | mean | lasttoken, then Normalize where asked."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    inner = Transformer(str(_transformers_dir(folder, family, False, seed)))
    modules = [inner, Pooling(inner.get_embedding_dimension(), pooling_mode=pooling)] + ([Normalize()] if normalize
                                                                                          else [])
    SentenceTransformer(modules=modules, device="cpu").save(str(folder / "model"))
    return folder / "model"


def make_cross_encoder(folder: Path, family: str, seed: int = 0) -> Path:
    from sentence_transformers import CrossEncoder

    CrossEncoder(str(_transformers_dir(folder, family, True, seed)), device="cpu").save(str(folder / "model"))
    return folder / "model"
