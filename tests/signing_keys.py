"""An EC key pair for signed-version tests (issue 40), made with `cryptography`: nothing is read from outside."""

from __future__ import annotations

import hashlib
from pathlib import Path


def ec_key_pair(folder: Path, name: str = "key") -> tuple[Path, Path, str]:
    """A fresh P-256 key pair as PEM files (private PKCS#8, public SubjectPublicKeyInfo) in `folder`, and the public
    key's id as the server reports it (`sha256:` and the sha256 of its DER SubjectPublicKeyInfo)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public, "sha256:" + hashlib.sha256(der).hexdigest()
