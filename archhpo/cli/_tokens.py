"""`archhpo tokens TEXT OUT`: a UTF-8 text file written as a token file of its bytes.

The file is nanoGPT's ``train.bin`` layout (flat little-endian ``uint16`` ids, no header), one id
per byte (vocabulary 256), so ``--data tokens:OUT,vocab=256`` trains on what ``--data TEXT`` would,
streamed from disk.  The text is read in pieces (a corpus larger than memory converts too) and
the output appears only when the whole text was UTF-8 (an atomic write: nothing is left otherwise).
"""

from __future__ import annotations

import argparse
import codecs
from pathlib import Path
from typing import BinaryIO

from archhpo._io import atomic_write, unwritable
from archhpo.errors import ArchhpoError, DataError

CHUNK = 1 << 24  # bytes of text converted at a time
BYTE_VOCAB = 256


def add_tokens_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("text", metavar="TEXT", help="a UTF-8 text file")
    sp.add_argument("out", metavar="OUT", help="the token file to write (flat uint16, e.g. train.bin)")


def _checked_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    text, out = (Path(p).expanduser().resolve() for p in (args.text, args.out))
    if not text.is_file():
        raise ArchhpoError(f"Text file {text} does not exist or is not a file; pass a UTF-8 text file.")
    if text.stat().st_size == 0:
        raise ArchhpoError(f"Text file {text} is empty; pass a file with text in it.")
    if out == text:
        raise ArchhpoError(f"OUT is the text file itself ({text}); name another file, e.g. train.bin.")
    if out.suffix == ".npy":
        raise ArchhpoError(f"{out.name} would hold no .npy header (the file is flat uint16 ids); name it e.g. train.bin.")
    if out.is_dir():
        raise ArchhpoError(f"OUT {out} is a folder; name a file in it, e.g. {out / 'train.bin'}.")
    problem = unwritable(out.parent)
    if problem is not None:
        raise ArchhpoError(f"Cannot write {out} ({problem}); choose a folder you can write to.")
    return text, out


def cmd_tokens(args: argparse.Namespace) -> int:
    import numpy as np

    text, out = _checked_paths(args)
    decoder = codecs.getincrementaldecoder("utf-8")()

    def write(fh: BinaryIO) -> None:
        done = 0
        with text.open("rb") as src:
            while chunk := src.read(CHUNK):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    raise DataError(f"Text file {text} is not UTF-8 (near byte {done + exc.start:,}); "
                                    "save it as UTF-8.") from None
                fh.write(np.frombuffer(chunk, dtype=np.uint8).astype("<u2").tobytes())
                done += len(chunk)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise DataError(f"Text file {text} ends inside a UTF-8 character; save it as UTF-8.") from None

    atomic_write(out, write)
    n = text.stat().st_size
    print(f"Wrote {n:,} tokens (uint16, one a byte) to {out}; train on them with "
          f"--data tokens:{out},vocab={BYTE_VOCAB}")
    return 0
