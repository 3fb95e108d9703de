"""Reference point: plain ``transformers`` ``generate()`` in-process, one request at a time.

Run by the comparison driver as a subprocess (``python -m bench.reference ...``) with the same
prompts and token budget as the servers; writes ``{"samples": [...], "wall_s", "cpu_s"}`` in
the :class:`bench.client.RequestResult` format so the driver summarises it like any system.
Token timestamps come from a streamer: ``generate()`` hands it the prompt once, then every
new token as soon as it is sampled. torch and transformers are imported inside ``main`` so
importing ``bench`` stays cheap.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.client import RequestResult
from bench.prompts import Prompt, load_prompts


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.reference", description=__doc__)
    p.add_argument("--model-path", required=True, help="Local Hugging Face model folder.")
    p.add_argument("--prompts", type=Path, required=True, help="JSON-lines prompt file.")
    p.add_argument("--num-requests", type=int, required=True)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads.")
    p.add_argument("--device", default="cpu", help="torch device of the model (cpu, cuda).")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.streamers import BaseStreamer

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    # Typed as Any: transformers' generate() stubs do not type-check on Auto classes.
    model: Any = AutoModelForCausalLM.from_pretrained(
        args.model_path, dtype=getattr(torch, args.dtype)
    ).to(args.device)
    model.eval()
    prompts = load_prompts(args.prompts)

    class TokenClock(BaseStreamer):  # type: ignore[misc]
        """Records when each generated token reaches the streamer (the prompt comes first)."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self._seen_prompt = False

        def put(self, value: Any) -> None:
            if self._seen_prompt:
                self.times.append(time.perf_counter())
            self._seen_prompt = True

        def end(self) -> None:
            return None

    def one(prompt: Prompt, index: int, origin: float, warmup: bool) -> RequestResult:
        t0 = time.perf_counter()
        if args.api == "chat":
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt.text}],
                add_generation_prompt=True,
                tokenize=False,
            )
            enc = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        else:
            enc = tokenizer(prompt.text, return_tensors="pt")
        enc = enc.to(args.device)
        clock = TokenClock()
        with torch.inference_mode():
            out = model.generate(
                **enc,
                max_new_tokens=args.max_tokens,
                min_new_tokens=args.max_tokens if args.ignore_eos else None,
                do_sample=False,
                streamer=clock,
                pad_token_id=tokenizer.eos_token_id,
            )
        end = time.perf_counter()
        prompt_len = int(enc["input_ids"].shape[1])
        chunks = tuple(t - t0 for t in clock.times)
        return RequestResult(
            index=index,
            prompt_index=prompt.index,
            ok=True,
            status=200,
            start=t0 - origin,
            e2e=end - t0,
            ttft=chunks[0] if chunks else None,
            chunk_times=chunks,
            output_tokens=int(out.shape[1]) - prompt_len,
            prompt_tokens=prompt_len,
            tokens_from_usage=True,
            warmup=warmup,
        )

    origin = time.perf_counter()
    samples = [one(prompts[i % len(prompts)], i, origin, True) for i in range(args.warmup)]
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for i in range(args.num_requests):
        samples.append(one(prompts[i % len(prompts)], i, origin, False))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    doc = {"samples": [s.to_json() for s in samples], "wall_s": wall, "cpu_s": cpu}
    args.out.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
