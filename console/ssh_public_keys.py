"""Reading an SSH public key that a person pasted: the one parser behind the account page,
the API and (later) the environments' authorized_keys.

The key itself is read by `cryptography` (`load_ssh_public_key`), never by a regex, and
only what OpenSSH would accept from a careful user is kept: Ed25519, ECDSA on the NIST
curves, RSA of at least 3,072 bits. Everything else is refused with a sentence that says
what to paste instead. What is stored is the normalised one-line form (`type base64`,
re-serialised by `cryptography`), with the comment kept apart, and the SHA256
fingerprint exactly as `ssh-keygen -l` prints it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa

from console.service_errors import ServiceError

RSA_MIN_BITS = 3072
RSA_MAX_BITS = 16384  # OpenSSH's own limit (SSH_RSA_MAXIMUM_MODULUS_SIZE)
# A 16,384-bit RSA key with a long comment is under 3,000 characters.
MAX_TEXT_LENGTH = 8192
MAX_COMMENT_LENGTH = 200

SUPPORTED_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                   "ecdsa-sha2-nistp521", "ssh-rsa")  # fmt: skip
# Key types OpenSSH knows that we refuse, each with the reason shown to the user.
REFUSED_TYPES = {
    "ssh-dss": "DSA keys are no longer accepted (OpenSSH itself has disabled them): they "
    "are 1,024 bits and weak. Make a new key with `ssh-keygen -t ed25519` and paste its .pub.",
    "sk-ssh-ed25519@openssh.com": "Security-key (FIDO) SSH keys are not supported yet. "
    "Paste an Ed25519, ECDSA or RSA (3,072 bits or more) public key.",
    "sk-ecdsa-sha2-nistp256@openssh.com": "Security-key (FIDO) SSH keys are not supported "
    "yet. Paste an Ed25519, ECDSA or RSA (3,072 bits or more) public key.",
}
CERTIFICATE_SUFFIX = "-cert-v01@openssh.com"
PRIVATE_KEY_MARKERS = ("PRIVATE KEY", "PuTTY-User-Key-File")

FIELD = "public_key"


@dataclass(frozen=True)
class ParsedPublicKey:
    """A validated public key: `public_key` is `type base64`, without the comment."""

    key_type: str
    bits: int
    public_key: str
    comment: str
    fingerprint: str

    @property
    def label(self) -> str:
        """What a person calls it: "ED25519", "ECDSA 384", "RSA 4096"."""
        return key_type_label(self.key_type, self.bits)


def key_type_label(key_type: str, bits: int) -> str:
    if key_type == "ssh-ed25519":
        return "ED25519"
    if key_type.startswith("ecdsa-"):
        return f"ECDSA {bits}"
    return f"RSA {bits}"


def fingerprint_sha256(blob: bytes) -> str:
    """`SHA256:` and the unpadded base64 of the key blob's digest, as `ssh-keygen -l`."""
    digest = hashlib.sha256(blob).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _refuse(message: str) -> ServiceError:
    return ServiceError(message, field=FIELD)


def _refuse_other_formats(text: str) -> None:
    if any(marker in text for marker in PRIVATE_KEY_MARKERS):
        raise _refuse(
            "This is a PRIVATE key, and it was not stored. Never share it: paste the public "
            "key instead, the one-line contents of the matching .pub file (e.g. "
            "~/.ssh/id_ed25519.pub). If this private key was pasted anywhere else, replace it."
        )
    if "BEGIN SSH2 PUBLIC KEY" in text:
        raise _refuse(
            "This is an SSH2 (RFC 4716) public key. Convert it to OpenSSH's one-line form "
            "with `ssh-keygen -i -f KEYFILE` and paste the result."
        )
    if "BEGIN PUBLIC KEY" in text or "BEGIN RSA PUBLIC KEY" in text:
        raise _refuse(
            "This is a PEM public key. Convert it to OpenSSH's one-line form with "
            "`ssh-keygen -i -m PKCS8 -f KEYFILE` and paste the result."
        )


def _split_key_line(text: str) -> tuple[str, str, str]:
    """(type, base64, comment) of one authorized_keys-style line; refuses option prefixes
    and certificates, whose meaning we would otherwise change silently."""
    tokens = text.split(None, 2)
    known = (*SUPPORTED_TYPES, *REFUSED_TYPES)
    if tokens[0] not in known and not tokens[0].endswith(CERTIFICATE_SUFFIX):
        if any(word in known or word.endswith(CERTIFICATE_SUFFIX) for word in text.split()):
            raise _refuse(
                "Remove the options before the key type (e.g. command=… or from=…): paste "
                "only the key, starting with its type such as ssh-ed25519. The console "
                "writes the authorized_keys lines itself."
            )
        raise _refuse(
            "This doesn't look like an SSH public key. Paste the one-line contents of your "
            ".pub file, starting with ssh-ed25519, ecdsa-sha2-nistp256 or ssh-rsa."
        )
    key_type = tokens[0]
    if key_type.endswith(CERTIFICATE_SUFFIX):
        raise _refuse(
            "This is an SSH certificate, not a public key. Paste the public key it was "
            "issued for (e.g. ~/.ssh/id_ed25519.pub, not id_ed25519-cert.pub)."
        )
    if key_type in REFUSED_TYPES:
        raise _refuse(REFUSED_TYPES[key_type])
    if len(tokens) < 2:
        raise _refuse(f"The {key_type} key has no key data after its type: paste the whole line.")
    comment = tokens[2].strip() if len(tokens) > 2 else ""
    return key_type, tokens[1], comment


def _key_bits(key: object) -> int:
    if isinstance(key, ed25519.Ed25519PublicKey):
        return 256
    if isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        return key.key_size
    if isinstance(key, dsa.DSAPublicKey):  # caught by type above; a mislabelled blob
        raise _refuse(REFUSED_TYPES["ssh-dss"])
    raise _refuse("This kind of SSH key is not supported. Paste an Ed25519, ECDSA or RSA key.")


def parse_public_key(text: str) -> ParsedPublicKey:
    """The validated key in `text`, or a ServiceError (field `public_key`) saying why not."""
    text = (text or "").strip()
    if not text:
        raise _refuse("Paste your public key, e.g. the contents of ~/.ssh/id_ed25519.pub.")
    if len(text) > MAX_TEXT_LENGTH:
        raise _refuse(
            f"That is {len(text):,} characters; a public key is one line of under "
            f"{MAX_TEXT_LENGTH:,}. Paste only the contents of the .pub file."
        )
    _refuse_other_formats(text)
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        raise _refuse("Paste one key at a time: this has several lines.")
    key_type, encoded, comment = _split_key_line(lines[0].strip())
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise _refuse("The key data is not valid base64: the line may be cut short.") from None
    try:
        key = serialization.load_ssh_public_key(f"{key_type} {encoded}".encode())
    except UnsupportedAlgorithm:
        raise _refuse(f"{key_type} keys are not supported.") from None
    except ValueError:
        raise _refuse(
            f"The key data is not a valid {key_type} key: it may be cut short or altered."
        ) from None
    bits = _key_bits(key)
    if isinstance(key, rsa.RSAPublicKey) and not RSA_MIN_BITS <= bits <= RSA_MAX_BITS:
        raise _refuse(
            f"This RSA key has {bits:,} bits; RSA keys need at least {RSA_MIN_BITS:,}. Make "
            "a new key with `ssh-keygen -t ed25519` (or `-t rsa -b 4096`) and paste its .pub."
            if bits < RSA_MIN_BITS
            else f"This RSA key has {bits:,} bits; OpenSSH accepts at most {RSA_MAX_BITS:,}."
        )
    normalised = key.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    canonical_type, canonical_data = normalised.split(" ", 1)
    if canonical_data != encoded or base64.b64decode(canonical_data) != blob:
        # A blob with trailing bytes or a non-minimal encoding: OpenSSH would refuse it.
        raise _refuse(f"The key data is not a valid {key_type} key: it has extra bytes.")
    comment = " ".join(comment.split())[:MAX_COMMENT_LENGTH]  # one line, no control runs
    return ParsedPublicKey(
        key_type=canonical_type,
        bits=bits,
        public_key=normalised,
        comment=comment,
        fingerprint=fingerprint_sha256(blob),
    )
