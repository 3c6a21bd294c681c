"""The BERT-layout encoder as one module: learned absolute positions plus token types, post-LayerNorm blocks of
bidirectional attention and a GELU MLP, and a cross-encoder's classification head. A batch is packed (the inputs'
tokens one after another): every matmul runs on real tokens only, and attention alone sees them padded into [B, T]
under a mask, so each input's output is its own."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tally.models.encoders.config import EncoderConfig

_ACT = {"gelu": F.gelu, "relu": F.relu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class EncoderLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(h, 3 * h)  # query, key and value in one matmul
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=eps)
        self.up = nn.Linear(h, cfg.intermediate_size)
        self.down = nn.Linear(cfg.intermediate_size, h)
        self.mlp_norm = nn.LayerNorm(h, eps=eps)
        self.act = _ACT[cfg.hidden_act]

    def forward(self, x: torch.Tensor, slots: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """x [N, H], the packed tokens; slots [N]: each token's place in the padded [B, T]; keep [B, 1, 1, T]: True
        where a key is a real token."""
        n, h = x.shape
        b, t = keep.shape[0], keep.shape[-1]
        padded = x.new_zeros(b * t, 3 * h)
        padded[slots] = self.qkv(x)
        q, k, v = padded.view(b, t, 3, self.num_heads, h // self.num_heads).permute(2, 0, 3, 1, 4)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2).reshape(b * t, h)[slots]
        x = self.attn_norm(x + self.attn_out(ctx))
        return self.mlp_norm(x + self.down(self.act(self.up(x))))


class ClassifierHead(nn.Module):
    """The CLS row → num_labels logits: BERT's pooler (dense + tanh) then a linear; RoBERTa's dense + tanh + out_proj
    is the same computation under other names (tally/models/encoders/loading.py maps them)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.out = nn.Linear(cfg.hidden_size, cfg.num_labels)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.dense(cls)))


class Encoder(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.config = cfg
        h = cfg.hidden_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, h)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, h)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, h)
        self.embed_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_layers))
        self.classifier = ClassifierHead(cfg) if cfg.is_cross_encoder else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The inputs' ids and token types packed [N], and each input's length [B] → the last hidden states [N, H]."""
        width = int(lengths.max())
        starts = torch.cumsum(lengths, 0) - lengths
        row = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        index = torch.arange(len(input_ids)) - starts[row]  # each token's index within its input
        positions = index
        if self.config.offset_positions:  # RoBERTa numbers the non-padding tokens after the padding id
            pad = self.config.pad_token_id
            ours = (input_ids != pad).long()
            counted = torch.cumsum(ours, 0) - torch.cumsum(ours, 0)[starts][row] + ours[starts][row]
            positions = torch.where(ours.bool(), counted + pad, pad)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids) \
            + self.position_embeddings(positions)
        x = self.embed_norm(x)
        keep = (torch.arange(width)[None, :] < lengths[:, None])[:, None, None, :]
        slots = row * width + index
        for layer in self.layers:
            x = layer(x, slots, keep)
        return x

    def scores(self, hidden: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """A cross-encoder's score per input: its first (CLS) row through the head, then the checkpoint's
        activation."""
        logits = self.classifier(hidden[starts]).float()
        return torch.sigmoid(logits) if self.config.classifier_activation == "sigmoid" else logits
