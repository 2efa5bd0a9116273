"""Compile RASP programs with tracr into GPT-2 folders that keyheads loads unchanged: circuits known in advance.

tracr (Lindner et al. 2023) turns a RASP program into transformer weights, so which attention head or MLP
computes each step of the program is known by construction. This script compiles the programs of PROGRAMS and
writes, for each, tests/fixtures/compiled/<name>/:

    config.json, model.safetensors, tokenizer.json, tokenizer_config.json   a GPT-2 folder (`--model PATH`)
    ground_truth.json   which head (layer.head, keyheads' numbering) or MLP implements each Select/Aggregate/Map,
                        which of them lie on the output's path, the conversion's constants
    tracr_outputs.json  tracr's own forward pass (the output space's logits at every position) on every input
                        of the program's domain, so that the exactness test needs no jax
    pairs.jsonl         reference / counterfactual pairs in keyheads' pairs format, for patching and knockout

It runs only here, in a venv of its own (requirements/tracr.txt, Python 3.11):

    .venv-tracr/bin/python -m studies.compile_circuits [--out tests/fixtures/compiled]

The embedding into GPT-2, and why it is exact
---------------------------------------------
tracr's model is a residual stack without layer norm: embeddings (tokens and positions, one-hot; position 0,
BOS's, has none), then per layer attention (softmax(QK^T / sqrt(key_size)), heads padded by tracr to one
key_size, biases zero) and a ReLU MLP, then the output space read off the final residual. GPT-2 differs in
three places, each made to act as the identity or compensated exactly:

1. Layer norm (ln_1, ln_2, ln_f). The residual gets two extra coordinates: CONST, 1 in every token embedding,
   and BALANCE, the negated sum of all the others, kept so by every write into the residual stream (token and
   position embeddings, each attention and MLP output projection get a BALANCE column equal to minus the sum
   of their other columns). So every residual vector sums to zero, and layer norm's mean subtraction removes
   only the float rounding of that sum. The norms' epsilon is 2**50 and their weight 2**25 = sqrt(2**50): in
   float32 var + 2**50 rounds to 2**50 for any var below 2**26 (the residual's is far smaller, see
   `max_variance` in ground_truth.json), so a norm multiplies by 2**-25 and then by 2**25, both exact powers of
   two. The norms are the identity up to the rounding of the mean.
2. Head size. GPT-2's head_dim is n_embd / n_head, and n_embd must hold tracr's residual plus CONST and BALANCE.
   head_dim is chosen as key_size * 4**m (the least such that n_head * head_dim holds them); each head's Q, K
   and V fill the first key_size of its head_dim columns, the rest are zero. GPT-2 divides by
   sqrt(head_dim) = sqrt(key_size) * 2**m, so Q is multiplied by 2**m: a power of two, exact in float.
3. The unembedding. lm_head is untied from the token embedding (tie_word_embeddings false). The row of each
   output value's token reads that value's direction of the output space, so its logit is tracr's output
   logit; every other token's row is minus CONST, a logit of exactly -1, below every output logit (tracr's
   categorical outputs are close to one-hot, in [0, 1]).

Readers of the residual stream (Q, K, V, the MLPs' first layer, lm_head's output rows) have zero weight on
CONST, BALANCE and the padding, so the extra coordinates change no computation. MLPs are ReLU
(activation_function "relu"), padded with zero hidden units to tracr's largest MLP. The programs are compiled
causal (`causal=True`): GPT-2 masks causally, and tracr's causal model is what it must equal. The answer
keyheads reads is at END, the last position, which sees the whole input; the programs here compute their
answer at END from tokens at or before it, so the causal model's answer at END is the program's (checked).

What remains is float rounding of a different order of operations (GPT-2's sqrt(head_dim) and matrix product
order, the mean's rounding), well inside the 1e-5 the tests allow.

Ground truth
------------
A head or MLP is *on the output's path* when the output's value depends on what it computes. Every compiled
node is an ancestor of the output (tracr compiles only those), so a head off the path must be an ancestor whose
value the output ignores: program `offpath` feeds an Aggregate into a SequenceMap whose function ignores that
argument. The head is in the weights, reads the input and writes its result into the residual stream, which
the next MLP reads, yet no input's answer depends on it. `direct` marks on-path heads whose effect reaches the
logits through MLPs alone: path patching with the logits as receivers measures exactly those, and freezes
every later head, so an on-path head that acts only through another head's query, key or value (program
`countfirst`'s first head) has no path-patching effect, though knocking it out or patching its activation
changes the answer.
"""
from __future__ import annotations

import argparse
import inspect
import itertools
import json
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BOS, PAD, UNK = "BOS", "PAD", "UNK"
CONST, BALANCE = "CONST", "BALANCE"
LN_EPS = 2.0 ** 50  # float32 var + eps == eps for var < 2**26
ROOT = Path(__file__).resolve().parents[1]


# ---- the programs ------------------------------------------------------------------------------------------
def program_add():
    """The sum of the first and the last token: one head copies the first token to every position, one MLP adds."""
    from tracr.rasp import rasp
    first = rasp.categorical(rasp.Aggregate(
        rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == 0), rasp.tokens)).named("first")
    return rasp.categorical(rasp.SequenceMap(lambda a, b: a + b, first, rasp.tokens)).named("sum"), []


def program_count():
    """How many tokens equal the last one (tracr's make_hist): a SelectorWidth, one head and one MLP."""
    from tracr.rasp import rasp
    same = rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.EQ).named("same")
    return rasp.categorical(rasp.SelectorWidth(same)).named("count"), []


def program_sum3():
    """The sum of three tokens: two heads in layer 0 copy the first and second token, two MLPs add."""
    from tracr.rasp import rasp
    first = rasp.categorical(rasp.Aggregate(
        rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == 0), rasp.tokens)).named("first")
    second = rasp.categorical(rasp.Aggregate(
        rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == 1), rasp.tokens)).named("second")
    pair = rasp.categorical(rasp.SequenceMap(lambda a, b: a + b, first, second)).named("pair")
    return rasp.categorical(rasp.SequenceMap(lambda s, t: s + t, pair, rasp.tokens)).named("sum"), []


def program_offpath():
    """First plus last token, with a head that copies the middle token into an MLP that ignores it.

    `middle` is compiled (a head of layer 0, reading the input and writing the residual stream) and reaches the
    output's ancestors, but the SequenceMap `keep` returns its first argument whatever the second: no answer
    depends on `middle`, so its head is off the output's path."""
    from tracr.rasp import rasp
    first = rasp.categorical(rasp.Aggregate(
        rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == 0), rasp.tokens)).named("first")
    middle = rasp.categorical(rasp.Aggregate(
        rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == 1), rasp.tokens)).named("middle")
    keep = rasp.categorical(rasp.SequenceMap(lambda f, m: f, first, middle)).named("keep")
    return rasp.categorical(rasp.SequenceMap(lambda a, b: a + b, keep, rasp.tokens)).named("sum"), [middle]


def program_countfirst():
    """How many tokens equal the first one: a head copies the first token, and the query of a SelectorWidth's
    head in the next layer reads it (the first head reaches the output only through the second)."""
    from tracr.rasp import rasp
    first = rasp.categorical(rasp.Aggregate(
        rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == 0), rasp.tokens)).named("first")
    same = rasp.Select(rasp.tokens, first, rasp.Comparison.EQ).named("same_as_first")
    return rasp.categorical(rasp.SelectorWidth(same)).named("count"), []


@dataclass(frozen=True)
class Program:
    name: str
    build: Callable  # () -> (output SOp, the SOps whose value the output ignores)
    vocab: tuple
    max_seq_len: int
    answer: Callable  # the program's answer at END, from the tokens (BOS excluded): the reference to check
    seed: int = 0


PROGRAMS = [
    Program("add", program_add, (0, 1, 2, 3), 2, lambda t: t[0] + t[-1]),
    Program("count", program_count, ("a", "b", "c"), 4, lambda t: t.count(t[-1])),
    Program("sum3", program_sum3, (0, 1, 2), 3, lambda t: t[0] + t[1] + t[2]),
    Program("offpath", program_offpath, (0, 1, 2), 3, lambda t: t[0] + t[-1]),
    Program("countfirst", program_countfirst, ("a", "b", "c"), 4, lambda t: t.count(t[0])),
]


# ---- compiling, keeping which node became which head or MLP -------------------------------------------------
def compile_program(program: Program):
    """tracr's compile_rasp_to_model step by step, keeping the graph: -> (assembled model, layout, graph, output
    SOp, labels of the nodes whose value the output ignores).

    layout: [(module name "transformer/layer_N/attn" or ".../mlp", [node labels])], a layer's heads in order."""
    from tracr.compiler import (
        basis_inference,
        craft_graph_to_model,
        craft_model_to_transformer,
        expr_to_craft_graph,
        nodes,
        rasp_to_graph,
    )

    # two private helpers of tracr (pinned in requirements/tracr.txt): the ones its own assembly uses to place
    # blocks in layers, so that the layout read here is the one the weights have
    from tracr.compiler.assemble import _get_model_config_and_module_names
    from tracr.craft import bases, transformers
    from tracr.rasp import rasp

    output, ignored_sops = program.build()
    ignored = {sop.label for sop in ignored_sops}
    extracted = rasp_to_graph.extract_rasp_graph(output)
    graph, sources, sink = extracted.graph, extracted.sources, extracted.sink
    basis_inference.infer_bases(graph, sink, set(program.vocab), program.max_seq_len)
    expr_to_craft_graph.add_craft_components_to_rasp_graph(
        graph, bos_dir=bases.BasisDirection(rasp.tokens.label, BOS), mlp_exactness=100)
    craft_model = craft_graph_to_model.craft_graph_to_model(graph, sources)
    # which craft block came from which node: attention heads by identity, MLPs by the layer they were given
    owner: dict[int, str] = {}
    by_layer: dict[int, list[str]] = {}
    for node_id, layer_no in craft_graph_to_model._allocate_modules_to_layers(graph, sources).items():
        block = graph.nodes[node_id].get(nodes.MODEL_BLOCK)
        if block is None:
            continue
        parts = block.blocks if isinstance(block, transformers.SeriesWithResiduals) else [block]
        for offset, part in enumerate(parts):
            owner[id(part)] = node_id
            by_layer.setdefault(layer_no + offset, []).append(node_id)
    _, module_names = _get_model_config_and_module_names(craft_model)
    layout = []
    for module_name, block, layer_no in zip(module_names, craft_model.blocks, sorted(by_layer)):
        if isinstance(block, transformers.MLP):
            layout.append((module_name, by_layer[layer_no]))
        else:
            labels = [owner[id(head)] for head in block.as_multi().heads()]
            assert sorted(labels) == sorted(by_layer[layer_no]), (labels, by_layer[layer_no])
            layout.append((module_name, labels))
    model = craft_model_to_transformer.craft_model_to_transformer(
        craft_model=craft_model, graph=graph, sink=sink, max_seq_len=program.max_seq_len, causal=True,
        compiler_bos=BOS, compiler_pad=PAD)
    return model, layout, graph, output, ignored


def node_name(label: str) -> str:
    """A node's name as the program gives it: rasp appends a counter that depends on what ran before."""
    return re.sub(r"_\d+$", "", label)


def is_direct(graph, label: str, sink: str) -> bool:
    """Whether `label`'s value reaches the output through MLP nodes alone (Map, SequenceMap), not through
    another attention head: what path patching with the logits as receivers measures."""
    if label == sink:
        return True
    return any(node_kind(graph, child) in ("Map", "SequenceMap") and is_direct(graph, child, sink)
               for child in graph.successors(label))


def node_kind(graph, label: str) -> str:
    from tracr.compiler import nodes
    return type(graph.nodes[label][nodes.EXPR]).__name__


# ---- the GPT-2 weights -------------------------------------------------------------------------------------
def words(value) -> str:
    return str(value)


def vocabulary(program: Program, out_values) -> list[str]:
    """PAD, UNK, BOS, then the input tokens and the output values (as words), each once."""
    seen = [PAD, UNK, BOS]
    for v in list(program.vocab) + sorted(out_values, key=lambda v: (str(type(v)), v)):
        if words(v) not in seen:
            seen.append(words(v))
    return seen


def to_gpt2(model, program: Program, out_label: str) -> tuple[dict, dict, list[str], dict]:
    """-> (GPT-2 state dict of float32 arrays, config.json, vocabulary, conversion constants)."""
    p = {k: {n: np.asarray(v, dtype=np.float32) for n, v in d.items()} for k, d in model.params.items()}
    for key, d in p.items():  # tracr leaves every bias zero: the 'one' direction carries constants
        assert "b" not in d or not d["b"].any(), key
    cfg = model.model_config
    labels = model.residual_labels
    d_t = len(labels)
    n_head, key_size, n_layer = cfg.num_heads, cfg.key_size, cfg.num_layers
    m = 0
    while n_head * key_size * 4 ** m < d_t + 2:
        m += 1
    head_dim = key_size * 4 ** m
    n_embd = n_head * head_dim
    const, balance = d_t, d_t + 1
    out_values = list(model.output_encoder.encoding_map)
    vocab = vocabulary(program, out_values)
    in_map = model.input_encoder.encoding_map  # tracr value -> tracr token id

    def widen(rows: np.ndarray) -> np.ndarray:
        """[n, d_t] residual writes -> [n, n_embd] with BALANCE = -sum (CONST included when set)."""
        out = np.zeros((rows.shape[0], n_embd), np.float64)
        out[:, :rows.shape[1]] = rows
        out[:, balance] = -out[:, :balance].sum(1)
        return out.astype(np.float32)

    def read(cols: np.ndarray) -> np.ndarray:
        """[d_t, k] residual reads -> [n_embd, k], zero on CONST, BALANCE and padding."""
        out = np.zeros((n_embd, cols.shape[1]), np.float32)
        out[:d_t] = cols
        return out

    by_value = {words(v): v for v in list(in_map)}
    tok_rows = np.zeros((len(vocab), d_t + 1), np.float32)
    for i, word in enumerate(vocab):
        source = {PAD: PAD, BOS: BOS}.get(word, by_value.get(word))
        if source is not None and source in in_map:
            tok_rows[i, :d_t] = p["token_embed"]["embeddings"][in_map[source]]
        tok_rows[i, const] = 1.0
    # one position more than tracr's: the answer token after END, which fine-tuning feeds in (causal masking keeps
    # it from every position before it); it has no index, as BOS has none
    pos_rows = np.concatenate([p["pos_embed"]["embeddings"], np.zeros((1, d_t), np.float32)])
    state = {"transformer.wte.weight": widen(tok_rows), "transformer.wpe.weight": widen(pos_rows)}
    ones = np.full(n_embd, 2.0 ** 25, np.float32)
    zeros = np.zeros(n_embd, np.float32)
    max_hidden = cfg.mlp_hidden_size
    for layer in range(n_layer):
        pre = f"transformer/layer_{layer}"
        h = f"transformer.h.{layer}"
        qkv = np.zeros((n_embd, 3 * n_embd), np.float32)
        for j, part in enumerate(("query", "key", "value")):
            w = p[f"{pre}/attn/{part}"]["w"] * (2.0 ** m if part == "query" else 1.0)
            for head in range(n_head):
                dst = j * n_embd + head * head_dim
                qkv[:d_t, dst:dst + key_size] = w[:, head * key_size:(head + 1) * key_size]
        linear = p[f"{pre}/attn/linear"]["w"]  # [(heads key_size), d_t]
        proj = np.zeros((n_embd, d_t), np.float32)
        for head in range(n_head):
            proj[head * head_dim:head * head_dim + key_size] = linear[head * key_size:(head + 1) * key_size]
        state.update({
            f"{h}.ln_1.weight": ones, f"{h}.ln_1.bias": zeros,
            f"{h}.attn.c_attn.weight": qkv, f"{h}.attn.c_attn.bias": np.zeros(3 * n_embd, np.float32),
            f"{h}.attn.c_proj.weight": widen(proj), f"{h}.attn.c_proj.bias": zeros,
            f"{h}.ln_2.weight": ones, f"{h}.ln_2.bias": zeros,
            f"{h}.mlp.c_fc.weight": read(p[f"{pre}/mlp/linear_1"]["w"]),
            f"{h}.mlp.c_fc.bias": np.zeros(max_hidden, np.float32),
            f"{h}.mlp.c_proj.weight": widen(p[f"{pre}/mlp/linear_2"]["w"]), f"{h}.mlp.c_proj.bias": zeros,
        })
    state["transformer.ln_f.weight"], state["transformer.ln_f.bias"] = ones, zeros
    lm_head = np.zeros((len(vocab), n_embd), np.float32)
    out_words = {words(v): v for v in out_values}
    for i, word in enumerate(vocab):
        if word in out_words:
            lm_head[i, labels.index(f"{out_label}:{out_words[word]}")] = 1.0
        else:
            lm_head[i, const] = -1.0
    state["lm_head.weight"] = lm_head
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": len(vocab),
        "n_positions": program.max_seq_len + 2, "n_embd": n_embd, "n_layer": n_layer, "n_head": n_head,
        "n_inner": max_hidden, "activation_function": "relu", "layer_norm_epsilon": LN_EPS,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "summary_first_dropout": 0.0,
        "initializer_range": 0.02, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": False, "use_cache": False,
        "bos_token_id": vocab.index(BOS), "eos_token_id": vocab.index(PAD), "pad_token_id": vocab.index(PAD),
        "dtype": "float32",
    }
    conversion = {"tracr_residual": d_t, "const": const, "balance": balance, "n_embd": n_embd,
                  "key_size": key_size, "head_dim": head_dim, "query_scale": 2.0 ** m, "ln_eps": LN_EPS,
                  "ln_weight": 2.0 ** 25, "other_token_logit": -1.0, "output_label": node_name(out_label),
                  "output_values": [words(v) for v in out_values]}
    return state, config, vocab, conversion


def tokenizer_json(vocab: list[str]) -> str:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(PAD, special=True), AddedToken(UNK, special=True)])
    return tok.to_str(pretty=True)


# ---- tracr's outputs, the domain, the pairs ----------------------------------------------------------------
def tracr_forward(model, tokens: list, out_label: str) -> tuple[np.ndarray, list, list[np.ndarray]]:
    """tracr's forward on BOS + tokens: (the output space's logits at every position, [T, n_out], before the
    argmax; the decoded outputs; the residual stream after every half-layer, each [T, d])."""
    out = model.apply([BOS] + list(tokens))
    final = np.asarray(out.transformer_output, dtype=np.float32)[0]  # [T, d]
    cols = [model.residual_labels.index(f"{out_label}:{v}") for v in model.output_encoder.encoding_map]
    residuals = [np.asarray(out.input_embeddings, np.float64)[0]] + [np.asarray(r, np.float64)[0]
                                                                     for r in out.residuals]
    return final[:, cols], out.decoded, residuals


def norm_variance(residual: np.ndarray, n_embd: int) -> float:
    """The largest variance a GPT-2 layer norm sees at these positions: tracr's residual plus CONST (1) and
    BALANCE (minus the sum), zero padding, over n_embd coordinates (the mean is zero)."""
    total = residual.sum(-1) + 1.0
    return float((((residual ** 2).sum(-1) + 1.0 + total ** 2) / n_embd).max())


def prompt(tokens) -> str:
    return " ".join([BOS] + [words(t) for t in tokens])


def make_pairs(program: Program, answers: dict[tuple, object]) -> list[dict]:
    """Each full-length input with a counterfactual that differs at every token and in its answer, so that every
    head's input changes and an on-path head's change moves the answer (None when no such input exists)."""
    rng = random.Random(program.seed)
    full = [t for t in answers if len(t) == program.max_seq_len]
    pairs = []
    for ref in full:
        options = [cf for cf in full if all(a != b for a, b in zip(ref, cf)) and answers[cf] != answers[ref]]
        if not options:
            continue
        cf = rng.choice(options)
        pairs.append({"task": program.name, "template": program.name, "reference": prompt(ref),
                      "counterfactual": prompt(cf), "answer": words(answers[ref]), "operands": None,
                      "positions": None})
    return pairs


def write_program(program: Program, out: Path) -> dict:
    import tracr
    from safetensors.numpy import save_file
    from tracr.rasp import rasp

    model, layout, graph, output, ignored = compile_program(program)
    out_label = output.label
    state, config, vocab, conversion = to_gpt2(model, program, out_label)
    # tracr's outputs on every input of every length, and the program's answer at END
    outputs, answers, variances = [], {}, []
    for n in range(1, program.max_seq_len + 1):
        for tokens in itertools.product(program.vocab, repeat=n):
            logits, decoded, residuals = tracr_forward(model, list(tokens), out_label)
            row = {"prompt": prompt(tokens), "decoded": [words(d) for d in decoded], "logits": logits.tolist()}
            if n == program.max_seq_len:  # the domain: the answer at END is the program's
                rasp_end = rasp.evaluate(output, list(tokens))[-1]
                assert rasp_end == program.answer(list(tokens)), (program.name, tokens, rasp_end)
                assert decoded[-1] == rasp_end, (program.name, tokens, decoded, rasp_end)
                answers[tokens] = rasp_end
                row["answer"] = words(rasp_end)
            outputs.append(row)
            variances += [norm_variance(r, conversion["n_embd"]) for r in residuals]
    # below 2**26 the layer norms are exact (see the docstring)
    conversion["max_variance"] = max(variances)
    assert conversion["max_variance"] < 2.0 ** 26
    heads, mlps = [], []
    for module_name, node_labels in layout:
        layer = int(module_name.split("layer_")[1].split("/")[0])
        if module_name.endswith("attn"):
            for index, label in enumerate(node_labels):
                heads.append({"layer": layer, "head": index, "node": node_name(label), "kind": node_kind(graph, label),
                              "on_path": label not in ignored,
                              "direct": label not in ignored and is_direct(graph, label, out_label)})
        else:
            mlps.append({"layer": layer, "nodes": [node_name(n) for n in node_labels],
                         "kinds": [node_kind(graph, n) for n in node_labels],
                         "on_path": any(n not in ignored for n in node_labels)})
    truth = {
        "program": program.name, "description": inspect.getdoc(program.build),
        "source": inspect.getsource(program.build), "vocab": [words(v) for v in program.vocab],
        "max_seq_len": program.max_seq_len, "bos": BOS, "output": node_name(out_label),
        "n_layers": config["n_layer"], "n_heads": config["n_head"], "heads": heads, "mlps": mlps,
        "ignored_nodes": sorted(node_name(n) for n in ignored), "conversion": conversion,
        "compiler": {"tracr-pypi": getattr(tracr, "__version__", "1.0.0"), "causal": True, "mlp_exactness": 100},
    }
    # written beside the folder, then moved into its place: a crash leaves the old folder or none, never half of one
    final = out / program.name
    folder = out / f".{program.name}.tmp"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    # exact only in float32: its norm weights (2^25) and layer-norm epsilon (2^50) overflow float16 and lose bits in
    # bfloat16; keyheads' loader refuses another dtype and loads this one by default (models.loading)
    config["keyheads_exact_dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (folder / "tokenizer.json").write_text(tokenizer_json(vocab))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": PAD, "unk_token": UNK,
        "clean_up_tokenization_spaces": False}, indent=1) + "\n")
    (folder / "ground_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    (folder / "tracr_outputs.json").write_text(json.dumps(outputs) + "\n")
    pairs = make_pairs(program, answers)
    (folder / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    shutil.rmtree(final, ignore_errors=True)
    folder.rename(final)
    return truth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "compiled"))
    parser.add_argument("--only", nargs="*", help="program names (default: all)")
    args = parser.parse_args()
    for program in PROGRAMS:
        if args.only and program.name not in args.only:
            continue
        truth = write_program(program, Path(args.out))
        placed = ", ".join(f"{h['layer']}.{h['head']}={h['node']}" + ("" if h["on_path"] else " (off path)")
                           for h in truth["heads"])
        print(f"{program.name}: heads {placed}; mlps {[(m['layer'], m['nodes']) for m in truth['mlps']]}; "
              f"max variance {truth['conversion']['max_variance']:.3g}")


if __name__ == "__main__":
    main()
