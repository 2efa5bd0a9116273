"""`make demo`: run what the pipeline has, on the bundled default model."""
from __future__ import annotations

from pathlib import Path

FEW_SHOT = "1 + 2 = 3\n4 + 4 = 8\n6 + 1 = 7\n"


def run_demo(args) -> int:
    import torch

    from .commands.models import load_from_args
    from .io import write_json

    out = Path(args.out)
    model = load_from_args(args)
    print(model)
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10) if a + b < 10]
    prompts = [f"{FEW_SHOT}{a} + {b} = " for a, b in pairs]
    answers = [model.tokens(str(a + b))[0] for a, b in pairs]
    with torch.no_grad():
        logits = model.forward(model.encode(prompts))[:, -1]
    correct = (logits.argmax(-1) == torch.tensor(answers, device=logits.device)).tolist()
    accuracy = sum(correct) / len(correct)
    print(f"single-digit addition with a 3-example prefix: {sum(correct)}/{len(correct)} correct ({accuracy:.0%})")
    write_json(out / "demo.json", {"model": model.name, "task": "addition", "n": len(correct), "accuracy": accuracy})
    print(f"wrote {out / 'demo.json'}")
    return 0
