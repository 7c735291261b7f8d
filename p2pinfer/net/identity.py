"""The node's persistent libp2p identity (its peer id) in a key file.

A stable peer id lets peers recognise a node that restarts (its digest epoch
changes, its id does not) and lets operators write bootstrap lists. The file
holds the standard libp2p protobuf encoding of the private key (the format
go-libp2p and rust-libp2p use), created with mode 0600; a key file that
others can read is refused, as ssh refuses such keys.
"""

from __future__ import annotations

import os
from pathlib import Path
import stat

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.serialization import deserialize_private_key

__all__ = ["IdentityError", "load_or_create_identity"]


class IdentityError(RuntimeError):
    """The key file exists but cannot be used."""


def load_or_create_identity(path: str | os.PathLike[str] | None) -> KeyPair:
    """The key pair stored at ``path``; a new one is created there if missing.

    ``None`` gives a fresh Ed25519 identity that lives as long as the process.
    """
    if path is None:
        return create_new_key_pair()
    file = Path(path)
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        return _create(file)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise IdentityError(f"key file {file} is readable by others (mode {stat.filemode(mode)}); chmod 600 it")
    data = file.read_bytes()
    try:
        private = deserialize_private_key(data)
    except Exception as exc:  # libp2p raises several types for garbage
        raise IdentityError(f"key file {file} does not hold a libp2p private key: {exc}") from None
    return KeyPair(private, private.get_public_key())


def _create(file: Path) -> KeyPair:
    pair = create_new_key_pair()
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(pair.private_key.serialize())
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, file)  # fails if another process created it meanwhile
        except FileExistsError:
            return load_or_create_identity(file)
    finally:
        tmp.unlink(missing_ok=True)
    return pair
