"""`accelstack manifest keygen | sign | verify`: the publisher's signing tools."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import List, Optional

from ..errors import AccelstackError, UsageError
from ..limits import MAX_DOCUMENT_INT, MAX_SIGNATURE_BYTES
from ..manifests.envelope import check_envelope
from ..manifests.errors import ManifestError, ManifestKeyError
from ..manifests.fields import check_id, decode, read_document
from ..manifests.keys import generate_keypair, keyid_of, parse_public_key, public_raw_of_private
from ..manifests.signatures import read_manifest_files, sign_manifest, signature_path
from ..manifests.trust import TrustedManifests
from ..settings import Settings
from .common import emit, needs_subcommand

# An expiry past the years a manifest may name (limits.MAX_DATETIME_YEAR) would be refused by
# every user; 50 years is far beyond any sensible release cadence.
MAX_EXPIRES_DAYS = 50 * 366


def _user_keys_dir() -> str:
    """Where users put trusted keys, for help texts (a bad setting must not break --help)."""
    try:
        return str(Settings.resolve().user_keys_dir)
    except AccelstackError:
        return "the trusted-keys directory of accelstack's user configuration"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "manifest",
        help="create signing keys, sign and verify manifests (for publishers)",
        description="Publisher tools for signed manifests. A manifest is signed with Ed25519; the signature "
        "lives beside it as MANIFEST.sig. Users trust public keys shipped with accelstack or placed in "
        f"{_user_keys_dir()} (one base64 key per *.pub file).",
        epilog="examples:\n"
        "  accelstack manifest keygen --out keys/release          keys/release.key (secret) + keys/release.pub\n"
        "  accelstack manifest sign manifest.json --key keys/release.key   writes manifest.json.sig\n"
        "  accelstack manifest verify manifest.json --key keys/release.pub check it as a user would",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    msub = p.add_subparsers(dest="manifest_command", metavar="ACTION")

    kg = msub.add_parser("keygen", help="create an Ed25519 key pair",
                         description="Write PREFIX.key (PKCS#8 PEM private key, mode 0600; keep it secret) and "
                         "PREFIX.pub (base64 of the raw 32-byte public key, to publish and to ship).",
                         epilog="examples:\n  accelstack manifest keygen --out keys/release\n"
                         "  accelstack manifest keygen --out keys/release --force --json", formatter_class=argparse.RawDescriptionHelpFormatter)
    kg.add_argument("--out", required=True, metavar="PREFIX", help="path prefix of the two files")
    kg.add_argument("--force", action="store_true", help="overwrite existing files")
    kg.add_argument("--json", action="store_true", help="print the result as JSON")
    kg.set_defaults(func=run_keygen)

    sg = msub.add_parser("sign", help="sign a manifest (writes MANIFEST.sig)",
                         description="Check the manifest's envelope, then write (or update, keeping other keys' "
                         "signatures) MANIFEST.sig with an Ed25519 signature of the file's exact bytes.",
                         epilog="examples:\n  accelstack manifest sign dist/ggml-manifest.json --key keys/release.key\n"
                         "  accelstack manifest sign m.json --key keys/next.key          adds a second signature (key rotation)",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    sg.add_argument("manifest", help="the manifest JSON file")
    sg.add_argument("--key", required=True, metavar="FILE", help="the private key (PEM) from `keygen`")
    sg.add_argument("--out", metavar="FILE", help="signature file (default: MANIFEST.sig)")
    sg.add_argument("--replace", action="store_true", help="drop other keys' signatures instead of keeping them")
    sg.add_argument("--allow-expired", action="store_true", help="sign even if 'expires' has passed")
    sg.add_argument("--json", action="store_true", help="print the result as JSON")
    sg.set_defaults(func=run_sign)

    vf = msub.add_parser("verify", help="verify a manifest as accelstack would before using it",
                         description="Check the signature (against the shipped keys, your trusted-keys "
                         "directory and any --key), the envelope, the expiry date, and that the version is not "
                         "older than one already seen from the same source. Does not record the version unless "
                         "--record.",
                         epilog="examples:\n  accelstack manifest verify dist/ggml-manifest.json --key keys/release.pub\n"
                         "  accelstack manifest verify m.json --key keys/release.pub --only-keys --json",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    vf.add_argument("manifest", help="the manifest JSON file")
    vf.add_argument("--sig", metavar="FILE", help="signature file (default: MANIFEST.sig)")
    vf.add_argument("--key", action="append", default=[], metavar="PUB",
                    help="also trust this public key file (repeatable)")
    vf.add_argument("--only-keys", action="store_true",
                    help="trust only the --key files, not the shipped or user-configured keys")
    vf.add_argument("--insecure-unsigned", action="store_true",
                    help="accept an unsigned or wrongly signed manifest (only for a local mirror you control)")
    vf.add_argument("--no-rollback", action="store_true", help="skip the rollback check")
    vf.add_argument("--record", action="store_true", help="remember this version as the highest seen for its source")
    vf.add_argument("--home", metavar="DIR",
                    help="runtime home whose rollback state is checked and recorded (default: ACCELSTACK_HOME or "
                    "the user data dir, as for install)")
    vf.add_argument("--json", action="store_true", help="print the result as JSON")
    vf.set_defaults(func=run_verify)

    bd = msub.add_parser("build", help="write (and sign) the ggml manifest for a directory of builds",
                         description="Collect every build made with `accelstack build ggml --out DIR/...` under DIR "
                         "into DIR/ggml-manifest.json (targets with their properties, artifacts with sha256, size "
                         "and URL = BASE_URL/<path under DIR>), and sign it with --key. Upload DIR as-is.",
                         epilog="examples:\n  accelstack manifest build dist --base-url https://example.org/rt --key keys/release.key "
                         "--version 7\n  accelstack manifest build dist --base-url https://github.com/o/r/releases/download/v7 "
                         "--flat --key keys/release.key --version 7", formatter_class=argparse.RawDescriptionHelpFormatter)
    bd.add_argument("directory", metavar="DIR", help="the directory holding the builds")
    bd.add_argument("--base-url", required=True, metavar="URL", help="where DIR will be served from")
    bd.add_argument("--key", metavar="FILE", help="private key (PEM) to sign with; without it the manifest is unsigned")
    bd.add_argument("--source", default="default", help="the channel name users' rollback protection tracks")
    bd.add_argument("--version", type=int, required=True, help="manifest version; must grow with every release")
    bd.add_argument("--expires-days", type=int, default=180,
                    help=f"days until the manifest expires (default 180, at most {MAX_EXPIRES_DAYS})")
    bd.add_argument("--flat", action="store_true",
                    help="for a host without folders (GitHub release assets): each wheel's URL is "
                    "BASE_URL/<its path under DIR with / replaced by -->, and a copy of it by that name is put in DIR")
    bd.add_argument("--json", action="store_true", help="print the result as JSON")
    bd.set_defaults(func=run_build)

    p.set_defaults(func=needs_subcommand(p))


def run_build(args: argparse.Namespace) -> int:
    from ..publisher.publish import build_manifest, flat_assets, write_signed_manifest

    if not 1 <= args.expires_days <= MAX_EXPIRES_DAYS:
        raise UsageError(f"--expires-days must be 1 to {MAX_EXPIRES_DAYS}, got {args.expires_days}",
                         "a manifest is re-signed with every release; a few months is usual")
    if not 0 <= args.version <= MAX_DOCUMENT_INT:
        raise UsageError(f"--version must be 0 to {MAX_DOCUMENT_INT}, got {args.version}")
    try:
        check_id(args.source, "--source", "source (channel name)")
    except ManifestError as exc:
        raise UsageError(exc.message) from None
    key = _read_private(args.key) if args.key else None
    changed: List[str] = []
    doc = build_manifest(Path(args.directory), args.base_url, source=args.source, version=args.version,
                         expires_days=args.expires_days, changed=changed, flat=args.flat)
    for line in changed:
        print(f"note: {line}; publishing the file as it is", file=sys.stderr)
    path = write_signed_manifest(Path(args.directory), doc, key)
    assets = [str(path)] + ([str(path) + ".sig"] if key else [])
    if args.flat:
        for wheel, name in flat_assets(Path(args.directory)):
            flat = Path(args.directory) / name
            tmp = flat.with_name(name + ".tmp")
            shutil.copyfile(wheel, tmp)
            os.replace(tmp, flat)
            assets.append(str(flat))
    targets = [t["id"] for t in doc["targets"]]
    _emit(args, {"manifest": str(path), "signed": key is not None, "targets": targets, "version": args.version,
                 "changed": changed, "assets": assets},
          f"wrote {path} (version {args.version}, {'signed' if key else 'UNSIGNED'}) with {len(targets)} target(s): {', '.join(targets)}")
    return 0



def _emit(args: argparse.Namespace, data: dict, text: str) -> None:
    emit(args, data, text)


def run_keygen(args: argparse.Namespace) -> int:
    prefix = Path(args.out)
    key_path = prefix.with_name(prefix.name + ".key")
    pub_path = prefix.with_name(prefix.name + ".pub")
    for path in (key_path, pub_path):
        if path.exists() and not args.force:
            raise UsageError(f"{path} already exists", "pass --force to overwrite it, or choose another --out")
    key_path.parent.mkdir(parents=True, exist_ok=True)
    private_pem, public_b64 = generate_keypair()
    if key_path.exists():
        key_path.unlink()
    fd = os.open(str(key_path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private_pem)
    try:
        os.chmod(key_path, 0o600)
    except OSError:
        pass
    kid = keyid_of(parse_public_key(public_b64))
    pub_path.write_text(f"# accelstack manifest signing key {kid}\n{public_b64}\n", encoding="ascii")
    _emit(
        args,
        {"keyid": kid, "private_key": str(key_path), "public_key": str(pub_path)},
        f"key id {kid}\n  private key: {key_path} (keep it secret, mode 0600)\n  public key:  {pub_path} "
        f"(publish it; users put it in {_user_keys_dir()})",
    )
    return 0


def _read_private(path: str) -> bytes:
    try:
        return read_document(path, MAX_SIGNATURE_BYTES)
    except (OSError, ManifestError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) else exc.message
        raise UsageError(f"cannot read private key {path} ({detail or exc})") from None


def run_sign(args: argparse.Namespace) -> int:
    manifest = Path(args.manifest)
    data, _ = read_manifest_files(manifest)
    envelope = check_envelope(decode(data), check_expiry=not args.allow_expired)
    private_pem = _read_private(args.key)
    out = Path(args.out) if args.out else signature_path(manifest)
    existing: Optional[bytes] = None
    if out.exists() and not args.replace:
        try:
            existing = read_document(out, MAX_SIGNATURE_BYTES)
        except (OSError, ManifestError):
            existing = None  # an unreadable old .sig is replaced
    try:
        sig = sign_manifest(data, private_pem, existing)
    except ManifestError:
        if existing is None:
            raise
        sig = sign_manifest(data, private_pem)  # an unreadable old .sig is replaced
    kid = keyid_of(public_raw_of_private(private_pem))
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(sig)
    os.replace(tmp, out)
    _emit(
        args,
        {"manifest": str(manifest), "signature": str(out), "keyid": kid, "source": envelope.source,
         "version": envelope.version, "expires": envelope.expires},
        f"signed {manifest} ({envelope.source} version {envelope.version}, expires {envelope.expires}) "
        f"with key {kid}\n  signature: {out}",
    )
    return 0


def run_verify(args: argparse.Namespace) -> int:
    manifest = Path(args.manifest)
    data, sig = read_manifest_files(manifest)
    if args.sig:
        try:
            sig = read_document(args.sig, MAX_SIGNATURE_BYTES)
        except OSError as exc:
            raise UsageError(f"cannot read signature {args.sig} ({exc.strerror or exc})") from None
    if args.only_keys and not args.key:
        raise UsageError("--only-keys needs at least one --key")
    keys: List[Path] = [Path(k) for k in args.key]
    settings = Settings.resolve(home=args.home)
    try:
        trusted = TrustedManifests(
            keys=keys,
            user_keys_dir=None if args.only_keys else settings.user_keys_dir,
            include_package_keys=not args.only_keys,
            rollback_state=None if args.no_rollback else settings.rollback_state,
            insecure_unsigned=args.insecure_unsigned,
        )
    except ManifestKeyError as exc:
        raise UsageError(exc.message, exc.hint) from None
    result = trusted.verify(data, sig, str(manifest), record=args.record)
    env = result.envelope
    key = trusted.trust.get(result.keyid) if result.keyid else None
    signer = f"key {result.keyid} ({key.origin})" if key else "NO trusted signature (--insecure-unsigned)"
    _emit(
        args,
        {"ok": True, "manifest": str(manifest), "source": env.source, "version": env.version,
         "kind": env.kind, "expires": env.expires, "signed": result.signed, "keyid": result.keyid},
        f"OK: {manifest}: {env.source} version {env.version} ({env.kind}), expires {env.expires}, "
        f"signed by {signer}",
    )
    return 0
