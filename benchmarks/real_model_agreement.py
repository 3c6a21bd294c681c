"""How close the default GGUF path (blocks as stored, int8 activations in the dot products) stays to the model it
approximates, beside llama.cpp doing the same: greedy continuations of 8 prompts against transformers' fp32 model
of the dequantized file, counted as agreeing in full and by the depth of the first divergence.

    python benchmarks/real_model_agreement.py --model PATH.gguf --llama-cli PATH/llama-completion [--tokens 40]

--llama-cli is llama.cpp's llama-completion (or an older build's llama-cli), run at --temp 0 with --ignore-eos, or
its llama-simple example (greedy, stops at end of text); it prints text, so its depth is the longest prefix of
the reference's tokens whose text starts its output.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path

from tally import LLM, SamplingParams  # tally first: it sets the OpenMP wait policy before torch starts its threads
from peer_env import peer_env  # benchmarks/ is on sys.path when a script here runs

import torch
import transformers

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "import numpy as np\n\n# compute the mean of each row\n",
    "Photosynthesis is the process by which",
    "Q: What is 12 times 7?\nA:",
]


def reference_greedy(model, prompt_ids: list[int], tokens: int) -> list[int]:
    """transformers' own forward and cache, argmax at every step, EOS not special."""
    out, step, past = [], torch.tensor([prompt_ids]), None
    with torch.no_grad():
        for _ in range(tokens):
            res = model(step, past_key_values=past, use_cache=True)
            past, token = res.past_key_values, int(res.logits[0, -1].argmax())
            out.append(token)
            step = torch.tensor([[token]])
    return out


def logprob_gaps(model, prompt_ids: list[int], output) -> list[float]:
    """How far each token Tally chose sits from the reference's log-probability of it, the reference reading
    Tally's own continuation (so a divergence early does not end the count)."""
    chosen = list(output.token_ids)
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([prompt_ids + chosen])).logits[0].float(), -1)
    start = len(prompt_ids) - 1
    return [abs(lp[t].logprob - float(ref[start + i, t])) for i, (t, lp) in enumerate(zip(chosen, output.logprobs))]


def llama_cpp_text(binary: str, model: str, prompt: str, tokens: int, threads: int) -> str:
    """The continuation llama.cpp prints. llama-simple (greedy, no flags beyond these) echoes the prompt first and
    stops at an end-of-generation token; llama-completion is told not to do either."""
    simple = Path(binary).name == "llama-simple"
    argv = ([binary, "-m", model, "-n", str(tokens), prompt] if simple else
            [binary, "-m", model, "-p", prompt, "-n", str(tokens), "--temp", "0", "--ignore-eos", "-t", str(threads),
             "--no-display-prompt", "-no-cnv", "--seed", "0"])
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=peer_env(),
                         stdin=subprocess.DEVNULL).stdout
    return out.split(prompt, 1)[1] if simple else out


def token_depth(got: list[int], want: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def text_depth(text: str, want: list[int], tokenizer) -> int:
    return next((k - 1 for k in range(1, len(want) + 1) if not text.startswith(tokenizer.decode(want[:k]))),
                len(want))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a .gguf file")
    p.add_argument("--llama-cli", required=True, help="llama.cpp's llama-completion, llama-cli or llama-simple binary")
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    path = Path(a.model)
    kwargs = dict(gguf_file=path.name, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, **kwargs)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, dtype=torch.float32, quantization_config=transformers.GgufConfig(dequantize=True),
        **kwargs).eval()
    ids = [tokenizer(prompt).input_ids for prompt in PROMPTS]
    want = [reference_greedy(reference, prompt_ids, a.tokens) for prompt_ids in ids]
    llm = LLM(str(path))
    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True, logprobs=0)
    outputs = [o.outputs[0] for o in llm.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)]
    tally = [o.token_ids for o in outputs]
    gaps = [gap for i, o in zip(ids, outputs) for gap in logprob_gaps(reference, i, o)]
    del reference
    peer = [llama_cpp_text(a.llama_cli, a.model, prompt, a.tokens, a.threads) for prompt in PROMPTS]
    tally_depths = [token_depth(list(t), w) for t, w in zip(tally, want)]
    peer_depths = [text_depth(text, w, tokenizer) for text, w in zip(peer, want)]
    print(f"first divergence from transformers' fp32 dequantized model (of {a.tokens} greedy tokens)")
    print(f"{'prompt':<40} {'tally default':>14} {'llama.cpp':>10}")
    for prompt, t, c in zip(PROMPTS, tally_depths, peer_depths):
        print(f"{prompt.splitlines()[0][:40]:<40} {t:>14} {c:>10}")
    agree = [sum(d == a.tokens for d in depths) for depths in (tally_depths, peer_depths)]
    medians = [sorted(depths)[len(depths) // 2] for depths in (tally_depths, peer_depths)]
    n = len(PROMPTS)
    print(f"{'agree in full':<40} {f'{agree[0]}/{n}':>14} {f'{agree[1]}/{n}':>10}")
    print(f"{'median depth':<40} {medians[0]:>14} {medians[1]:>10}")
    print(f"Tally's chosen tokens: |log-probability - the reference's| mean {statistics.mean(gaps):.4f}, "
          f"max {max(gaps):.4f} over {len(gaps)} tokens")
    print(f"command: python benchmarks/real_model_agreement.py --model {a.model} --llama-cli {a.llama_cli}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
