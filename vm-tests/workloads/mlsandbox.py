#!/usr/bin/env python3
"""ML-agent sandbox workloads: a template with realistic ML memory and sandbox trajectories.

    mlsandbox.py --role template --style fork --n 8 --cgroup-root CGDIR --status DIR
    mlsandbox.py --role template --style fresh --status DIR          # a template that only idles
    mlsandbox.py --role sandbox --index 3 --status DIR               # fresh-process sandbox 3

The template state (built from --seed, identical in every process that builds it):
  - a decoder-only transformer's float32 weights (embedding tied with the head, attention and MLP
    matrices with per-row scales and heavy tails like trained weights, layer-norm gains/biases);
  - Adam optimizer state (m, v) of a checkpoint, step counter;
  - a tokenized dataset (int32 token ids, Zipf-distributed, document offsets as int64);
  - Python heaps: a BPE-like tokenizer vocabulary (dict str -> int, merges list), a corpus of
    documents (str), example records (dicts with token lists and metadata), a warmed interpreter
    (many stdlib modules imported and exercised: json, re, dataclasses, email, http, asyncio, ...).

Sandbox trajectories (--task, default by index, round robin over TASKS), each from its own seed:
  train     Adam steps on the top half of the layers and the tied embedding (real forward pass,
            backprop through the head and the trained MLPs), metrics logged in Python dicts
  generate  autoregressive generation with a per-layer KV cache, token lists, decoded strings
  data      tokenize new documents with the vocabulary, filter/shuffle the dataset into a copy,
            token statistics (Counter), new example records
  eval      forward passes over held-out batches, logits, per-example metrics
  sft       one full-model step at a small learning rate (every weight, m and v touched)
With --trim a sandbox then trims its heap (controlplane.trim: gc.collect + malloc_trim(0)), as
the agent loop's trim step does before a wait. Then the process writes STATUS/<name>.ready (its
pid) and idles (signal.pause) until killed.

Fork style: the template builds the state, gc.freeze()s it (as a zygote does), forks --n children;
each child moves itself into CGROUP_ROOT/sb<i> before running its task, so the pages it copies on
write or allocates are charged to its own memory cgroup. Environment for determinism:
PYTHONHASHSEED=0 (the launcher sets it).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import signal
import sys
import time

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # one BLAS thread: sandboxes share 2 vCPUs

import itertools  # noqa: E402

import numpy as np  # noqa: E402

TASKS = ("train", "generate", "data", "eval", "sft")

SIZES = {
    #          d    layers vocab  dataset tokens  docs  examples
    "tiny": (64, 2, 2048, 64 << 10, 200, 400),
    "small": (128, 4, 4096, 256 << 10, 600, 1200),
    "default": (160, 4, 6000, 512 << 10, 1200, 2000),
    "large": (256, 6, 16000, 2 << 20, 4000, 6000),
}


LOG_NAME = "mlsandbox"


def log(msg: str) -> None:
    print(f"[{LOG_NAME} {os.getpid()}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- warm interpreter
def warm_interpreter() -> list[object]:
    import argparse as _ap  # noqa: F401
    import asyncio
    import collections
    import dataclasses
    import decimal
    import email.parser
    import fractions
    import http.client  # noqa: F401
    import inspect
    import json
    import logging
    import pathlib
    import re
    import statistics
    import textwrap
    import typing  # noqa: F401
    import urllib.parse

    keep: list[object] = []
    pats = [
        re.compile(p)
        for p in (
            r"\b\w+\b",
            r"(\d+)\.(\d+)",
            r"[A-Z][a-z]+",
            r"\s+",
            r"^def (\w+)\(",
            r"(?P<key>\w+)=(?P<val>[^&]+)",
        )
    ]
    keep.append(pats)
    cfg = {
        "model": {"d": 160, "heads": 4, "act": "gelu"},
        "optim": {"lr": 3e-4, "betas": [0.9, 0.999]},
        "data": {"path": "/data/train.bin", "seq": 64},
        "tools": ["python", "bash", "search"],
    }
    keep.append(json.loads(json.dumps(cfg)))
    keep.append(email.parser.Parser().parsestr("From: agent@example.com\nSubject: run\n\nbody"))
    keep.append(urllib.parse.urlparse("https://example.com/v1/chat/completions?model=x&t=0.7"))
    keep.append([decimal.Decimal(i) / 7 for i in range(50)])
    keep.append([fractions.Fraction(i, 7) for i in range(50)])
    keep.append(statistics.mean(range(1000)))
    keep.append(textwrap.wrap("the quick brown fox " * 50, 40))
    keep.append(inspect.getsource(textwrap.wrap))
    keep.append(collections.Counter("the quick brown fox jumps over the lazy dog" * 20))
    keep.append(pathlib.Path("/tmp/x/y/z.txt").parts)
    logging.getLogger("agent").debug("warm")

    @dataclasses.dataclass
    class Msg:
        role: str
        content: str

    keep.append([Msg("user", f"message {i}") for i in range(200)])
    loop = asyncio.new_event_loop()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    return keep


# ---------------------------------------------------------------- text
_CONS = "bcdfghklmnprstvwz"
_VOW = "aeiou"


def make_words(rng: np.random.Generator, n: int) -> list[str]:
    words = set()
    while len(words) < n:
        k = int(rng.integers(1, 4))
        w = "".join(
            _CONS[int(rng.integers(len(_CONS)))] + _VOW[int(rng.integers(len(_VOW)))]
            for _ in range(k)
        )
        if rng.random() < 0.3:
            w += _CONS[int(rng.integers(len(_CONS)))]
        words.add(w)
    return sorted(words)


def make_docs(rng: np.random.Generator, words: list[str], n: int, mean_len: int) -> list[str]:
    ranks = np.arange(1, len(words) + 1)
    p = 1.0 / ranks**1.1
    p /= p.sum()
    docs = []
    for _ in range(n):
        ln = max(8, int(rng.normal(mean_len, mean_len / 3)))
        ids = rng.choice(len(words), size=ln, p=p)
        out = []
        for j, i in enumerate(ids):
            w = words[i]
            if j == 0 or out[-1].endswith("."):
                w = w.capitalize()
            if rng.random() < 0.08:
                w += "."
            elif rng.random() < 0.05:
                w += ","
            out.append(w)
        docs.append(" ".join(out) + ".")
    return docs


# ---------------------------------------------------------------- the model
class State:
    pass


def trained_like(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    """Weights shaped like a trained matrix: per-row scales, heavy tails, a low-rank part."""
    rows = shape[0]
    base = rng.standard_t(df=5, size=shape).astype(np.float32) * np.float32(std * 0.8)
    scale = np.exp(rng.normal(0, 0.25, size=(rows,) + (1,) * (len(shape) - 1))).astype(np.float32)
    w = base * scale
    if len(shape) == 2:
        r = max(1, min(shape) // 16)
        u = rng.normal(0, 1, size=(shape[0], r)).astype(np.float32)
        v = rng.normal(0, std / math.sqrt(r), size=(r, shape[1])).astype(np.float32)
        w += u @ v * np.float32(0.5)
    return np.ascontiguousarray(w, dtype=np.float32)


def build_state(seed: int, size: str) -> State:
    d, nl, vocab, ntok, ndocs, nex = SIZES[size]
    rng = np.random.default_rng(seed)
    st = State()
    st.d, st.nl, st.vocab, st.seq = d, nl, vocab, 64
    st.interp = warm_interpreter()
    # weights
    w: dict[str, np.ndarray] = {"emb": trained_like(rng, (vocab, d), 0.02)}
    for li in range(nl):
        for nm, shp in (
            ("wq", (d, d)),
            ("wk", (d, d)),
            ("wv", (d, d)),
            ("wo", (d, d)),
            ("w1", (d, 4 * d)),
            ("w2", (4 * d, d)),
        ):
            w[f"l{li}.{nm}"] = trained_like(rng, shp, 1.0 / math.sqrt(shp[0]))
        w[f"l{li}.ln1"] = (1 + rng.normal(0, 0.05, d)).astype(np.float32)
        w[f"l{li}.ln2"] = (1 + rng.normal(0, 0.05, d)).astype(np.float32)
        w[f"l{li}.b1"] = rng.normal(0, 0.01, 4 * d).astype(np.float32)
    w["lnf"] = (1 + rng.normal(0, 0.05, d)).astype(np.float32)
    st.w = w
    # Adam state of a checkpoint: m ~ recent gradients, v ~ their running second moment
    st.m = {}
    st.v = {}
    for k, a in w.items():
        g = rng.normal(0, 1e-3, a.shape).astype(np.float32) * np.abs(a).mean()
        st.m[k] = g
        st.v[k] = g * g * rng.uniform(0.5, 2.0, a.shape).astype(np.float32) + np.float32(1e-12)
    st.step = 1000
    # tokenizer + corpus
    words = make_words(rng, max(200, vocab // 3))
    pieces = sorted({w_[:k] for w_ in words for k in range(1, len(w_) + 1)})
    pieces = (pieces + [f"<extra_{i}>" for i in range(vocab)])[: vocab - 4]
    st.itos = ["<pad>", "<bos>", "<eos>", "<unk>", *pieces]
    st.stoi = {s: i for i, s in enumerate(st.itos)}
    st.merges = [(a, b) for a, b in itertools.pairwise(pieces) if len(a) < 4][:vocab]
    st.words = words
    st.docs = make_docs(rng, words, ndocs, 300)
    # dataset: Zipf-distributed ids, document boundaries
    z = rng.zipf(1.15, size=ntok)
    st.tokens = np.minimum(z + 3, vocab - 1).astype(np.int32)
    st.doc_offsets = np.cumsum(rng.integers(64, 1024, size=ntok // 300)).astype(np.int64)
    # example records
    st.examples = []
    for i in range(nex):
        doc = st.docs[i % len(st.docs)]
        toks = [st.stoi.get(t, 3) for t in doc.split()[:48]]
        st.examples.append(
            {
                "id": f"ex-{seed}-{i:06d}",
                "text": doc[:200],
                "tokens": toks,
                "meta": {"source": "synthetic", "len": len(doc), "score": float(i % 97) / 97},
            }
        )
    st.history: list[dict[str, object]] = []
    return st


def layer_norm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))


def forward(st: State, toks: np.ndarray, keep: bool = False):
    w = st.w
    x = w["emb"][toks]  # (B, T, d)
    T = toks.shape[1]
    mask = np.triu(np.full((T, T), -1e9, dtype=np.float32), 1)
    acts = []
    for li in range(st.nl):
        h = layer_norm(x, w[f"l{li}.ln1"])
        q, k, v = h @ w[f"l{li}.wq"], h @ w[f"l{li}.wk"], h @ w[f"l{li}.wv"]
        att = q @ k.transpose(0, 2, 1) / np.float32(math.sqrt(st.d)) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        x = x + (att @ v) @ w[f"l{li}.wo"]
        h2 = layer_norm(x, w[f"l{li}.ln2"])
        pre = h2 @ w[f"l{li}.w1"] + w[f"l{li}.b1"]
        x = x + gelu(pre) @ w[f"l{li}.w2"]
        if keep:
            acts.append((h2, pre))
    hf = layer_norm(x, w["lnf"])
    logits = hf @ w["emb"].T
    return logits, hf, acts


def adam(st: State, name: str, g: np.ndarray, lr: float) -> None:
    b1, b2 = 0.9, 0.999
    m, v, p = st.m[name], st.v[name], st.w[name]
    m *= b1
    m += (1 - b1) * g
    v *= b2
    v += (1 - b2) * g * g
    t = st.step + 1
    p -= np.float32(lr) * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + np.float32(1e-8))


def batch(st: State, rng: np.random.Generator, b: int) -> np.ndarray:
    starts = rng.integers(0, len(st.tokens) - st.seq - 1, size=b)
    return np.stack([st.tokens[s : s + st.seq + 1] for s in starts])


def train_steps(
    st: State, rng: np.random.Generator, steps: int, lr: float, layers: list[int]
) -> None:
    for _ in range(steps):
        bt = batch(st, rng, 4)
        x, y = bt[:, :-1], bt[:, 1:]
        logits, hf, acts = forward(st, x, keep=True)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        loss = float(-np.log(p[np.arange(4)[:, None], np.arange(st.seq)[None], y] + 1e-9).mean())
        dl = p
        dl[np.arange(4)[:, None], np.arange(st.seq)[None], y] -= 1
        dl /= dl.shape[0] * dl.shape[1]
        d2 = dl.reshape(-1, st.vocab)
        g_emb = d2.T @ hf.reshape(-1, st.d)
        np.add.at(g_emb, x.reshape(-1), (d2 @ st.w["emb"]) * 0.1)
        dh = (dl @ st.w["emb"]).reshape(-1, st.d)
        for li in sorted(layers, reverse=True):
            h2, pre = acts[li]
            a = gelu(pre).reshape(-1, 4 * st.d)
            g_w2 = a.T @ dh
            da = (dh @ st.w[f"l{li}.w2"].T) * (pre.reshape(-1, 4 * st.d) > 0)
            g_w1 = h2.reshape(-1, st.d).T @ da
            g_b1 = da.sum(0)
            for nm, g in (("w2", g_w2), ("w1", g_w1), ("b1", g_b1)):
                adam(st, f"l{li}.{nm}", g.astype(np.float32), lr)
            hh = h2.reshape(-1, st.d)
            for nm in ("wq", "wk", "wv", "wo"):
                g = hh.T @ (dh * np.float32(0.1))
                adam(st, f"l{li}.{nm}", g.astype(np.float32), lr)
            dh = dh + da @ st.w[f"l{li}.w1"].T * np.float32(0.5)
        adam(st, "emb", g_emb.astype(np.float32), lr)
        st.step += 1
        st.history.append({"step": st.step, "loss": loss, "lr": lr, "time": time.time()})


# ---------------------------------------------------------------- tasks
def task_train(st: State, rng: np.random.Generator) -> None:
    train_steps(st, rng, 3, 3e-4, list(range(st.nl // 2, st.nl)))


def task_sft(st: State, rng: np.random.Generator) -> None:
    train_steps(st, rng, 1, 2e-5, list(range(st.nl)))
    # full-model step: every remaining parameter gets an update too
    for name in st.w:
        if (
            name.startswith("l") and any(name.endswith(s) for s in ("ln1", "ln2"))
        ) or name == "lnf":
            adam(st, name, rng.normal(0, 1e-3, st.w[name].shape).astype(np.float32), 2e-5)
        elif name.startswith("l0.") or name.startswith(f"l{st.nl // 2 - 1}."):
            g = rng.normal(0, 1e-4, st.w[name].shape).astype(np.float32)
            adam(st, name, g, 2e-5)


def task_generate(st: State, rng: np.random.Generator) -> None:
    w = st.w
    max_len = 256
    outputs = []
    for prompt_no in range(3):
        kv = [
            (np.zeros((max_len, st.d), np.float32), np.zeros((max_len, st.d), np.float32))
            for _ in range(st.nl)
        ]
        toks = [1] + [int(t) for t in batch(st, rng, 1)[0][:16]]
        for pos in range(min(max_len - 1, 24 + 16 * prompt_no)):
            t = toks[pos] if pos < len(toks) else toks[-1]
            x = w["emb"][t][None]
            for li in range(st.nl):
                h = layer_norm(x, w[f"l{li}.ln1"])
                kc, vc = kv[li]
                kc[pos] = (h @ w[f"l{li}.wk"])[0]
                vc[pos] = (h @ w[f"l{li}.wv"])[0]
                q = h @ w[f"l{li}.wq"]
                att = (kc[: pos + 1] @ q[0]) / np.float32(math.sqrt(st.d))
                att = np.exp(att - att.max())
                att /= att.sum()
                x = x + (att @ vc[: pos + 1])[None] @ w[f"l{li}.wo"]
                h2 = layer_norm(x, w[f"l{li}.ln2"])
                x = x + gelu(h2 @ w[f"l{li}.w1"] + w[f"l{li}.b1"]) @ w[f"l{li}.w2"]
            if pos >= len(toks) - 1:
                logits = (layer_norm(x, w["lnf"]) @ w["emb"].T)[0] / np.float32(0.8)
                p = np.exp(logits - logits.max())
                p /= p.sum()
                toks.append(int(rng.choice(st.vocab, p=p)))
        text = " ".join(st.itos[t] for t in toks)
        outputs.append({"prompt": prompt_no, "tokens": toks, "text": text, "kv": kv})
    st.generations = outputs


def task_data(st: State, rng: np.random.Generator) -> None:
    import collections

    new_docs = make_docs(rng, st.words, len(st.docs) // 3, 250)
    counts: collections.Counter[str] = collections.Counter()
    tokenized = []
    for doc in new_docs:
        ids = []
        for wd in doc.split():
            wd = wd.strip(".,").lower()
            counts[wd] += 1
            ids.append(st.stoi.get(wd, 3))
        tokenized.append(ids)
    flat = np.fromiter((t for ids in tokenized for t in ids), dtype=np.int32)
    keep = st.tokens[st.tokens < st.vocab // 2]
    perm = rng.permutation(len(keep))
    st.tokens_filtered = np.concatenate([keep[perm], flat])
    st.vocab_stats = dict(counts.most_common())
    for i, ids in enumerate(tokenized):
        st.examples.append(
            {
                "id": f"new-{i:06d}",
                "text": new_docs[i][:200],
                "tokens": ids[:48],
                "meta": {"source": "scraped", "len": len(ids), "score": float(rng.random())},
            }
        )
    # a pass over the records (updates refcounts all over the template's heap)
    st.total_len = sum(e["meta"]["len"] for e in st.examples)


def task_eval(st: State, rng: np.random.Generator) -> None:
    results = []
    all_logits = []
    for _ in range(4):
        bt = batch(st, rng, 2)
        logits, _, _ = forward(st, bt[:, :-1])
        pred = logits.argmax(-1)
        acc = float((pred == bt[:, 1:]).mean())
        all_logits.append(logits[:, -8:].copy())
        for j in range(bt.shape[0]):
            results.append(
                {
                    "ids": bt[j].tolist(),
                    "acc": acc,
                    "pred": pred[j].tolist(),
                    "text": " ".join(st.itos[t] for t in pred[j][:32]),
                }
            )
    st.eval_results = results
    st.eval_logits = all_logits


TASK_FNS = {
    "train": task_train,
    "generate": task_generate,
    "data": task_data,
    "eval": task_eval,
    "sft": task_sft,
}


# ---------------------------------------------------------------- process roles
def ready(status: str | None, name: str) -> None:
    if status:
        tmp = os.path.join(status, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.rename(tmp, os.path.join(status, f"{name}.ready"))


def idle() -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        signal.pause()


def run_task(
    st: object, task: str, seed: int, trim: bool = False, fns: dict | None = None
) -> None:
    t0 = time.monotonic()
    (fns or TASK_FNS)[task](st, np.random.default_rng(seed))
    log(f"task {task} done in {time.monotonic() - t0:.1f}s")
    if trim:  # the agent loop's trim step, before the sandbox waits for the LLM
        from controlplane.trim import trim as trim_heap  # imported by main(), before any fork

        t = trim_heap()
        log(f"trim: {t.released_bytes >> 10} KiB released (malloc_trim: {t.malloc_trim})")


def main(argv: list[str] | None = None, *, doc: str | None = None, sizes: dict | None = None,
         build=None, fns: dict | None = None) -> None:
    """The process roles (template, fork children, fresh sandboxes) of a sandbox workload: this
    file's ML workload, or another one's state builder and task functions (codingsandbox.py)."""
    doc = doc or __doc__
    sizes = sizes or SIZES
    build = build or build_state
    fns = fns or TASK_FNS
    tasks = tuple(fns)
    # bench/record.py labels sandbox i with TASKS[i % len(TASKS)] of the workload's file
    if tasks != tuple(sys.modules[build.__module__].TASKS):
        raise SystemExit(f"{build.__module__}: TASK_FNS order differs from TASKS")
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--role", choices=("template", "sandbox"), required=True)
    ap.add_argument("--style", choices=("fork", "fresh"), default="fresh")
    ap.add_argument("--n", type=int, default=8, help="sandboxes to fork (fork style)")
    ap.add_argument("--index", type=int, default=0, help="sandbox number (fresh style)")
    ap.add_argument("--task", choices=tasks, help="default: the tasks round robin by index")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--size", choices=tuple(sizes), default="default")
    ap.add_argument("--cgroup-root", help="fork style: children join CGROUP_ROOT/sb<i>")
    ap.add_argument("--status", help="directory for <name>.ready files")
    ap.add_argument("--trim", action="store_true",
                    help="sandboxes trim their heap (controlplane.trim) after their task")
    a = ap.parse_args(argv)
    if a.trim:
        import controlplane.trim  # noqa: F401  (a sandbox's trim() then loads nothing)

    t0 = time.monotonic()
    st = build(a.seed, a.size)
    log(f"state built in {time.monotonic() - t0:.1f}s ({a.size})")
    if a.role == "sandbox":
        run_task(st, a.task or tasks[a.index % len(tasks)], a.seed * 1000 + a.index + 1, a.trim,
                 fns)
        ready(a.status, f"sb{a.index}")
        idle()
    if a.style == "fresh":
        ready(a.status, "template")
        idle()
    gc.collect()
    gc.freeze()
    for i in range(a.n):
        pid = os.fork()
        if pid == 0:
            try:
                if a.cgroup_root:
                    with open(os.path.join(a.cgroup_root, f"sb{i}", "cgroup.procs"), "w") as f:
                        f.write(str(os.getpid()))
                run_task(st, a.task or tasks[i % len(tasks)], a.seed * 1000 + i + 1, a.trim, fns)
                ready(a.status, f"sb{i}")
                idle()
            finally:
                os._exit(1)
    ready(a.status, "template")
    idle()


if __name__ == "__main__":
    main()
