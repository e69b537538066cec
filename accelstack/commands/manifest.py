"""`accelstack manifest keygen | sign | verify`: the publisher's signing tools."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List

from .. import core
from ..core import manifest_tools
from ..errors import AccelstackError, UsageError
from ..events import as_utc_z
from ..limits import MAX_DOCUMENT_INT
from ..serde import plural
from .common import check_output_path, emit, needs_subcommand, settings_from_args

__all__ = ["MAX_EXPIRES_DAYS", "register", "run_build", "run_keygen", "run_sign", "run_verify"]

# An expiry past the years a manifest may name (limits.MAX_DATETIME_YEAR) would be refused by
# every user; 50 years is far beyond any sensible release cadence.
MAX_EXPIRES_DAYS = 50 * 366


def _user_keys_dir() -> str:
    """Where users put trusted keys, for help texts (a bad setting must not break --help)."""
    try:
        return str(settings_from_args(None).user_keys_dir)
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
    if not 1 <= args.expires_days <= MAX_EXPIRES_DAYS:
        raise UsageError(f"--expires-days must be 1 to {MAX_EXPIRES_DAYS}, got {args.expires_days}",
                         "a manifest is re-signed with every release; a few months is usual")
    if not 0 <= args.version <= MAX_DOCUMENT_INT:
        raise UsageError(f"--version must be 0 to {MAX_DOCUMENT_INT}, got {args.version}")
    manifest_tools.check_source(args.source)
    directory = _build_dir(args.directory)
    key = manifest_tools.read_private_key(args.key) if args.key else None
    changed: List[str] = []
    doc = core.manifest_for_builds(directory, args.base_url, source=args.source, version=args.version,
                                   expires_days=args.expires_days, changed=changed, flat=args.flat)
    for line in changed:
        print(f"note: {line}; publishing the file as it is", file=sys.stderr)
    path, assets = core.write_manifest_dir(directory, doc, key, flat=args.flat)
    targets = [t["id"] for t in doc["targets"]]
    _emit(args, {"manifest": str(path), "signed": key is not None, "targets": targets, "version": args.version,
                 "changed": changed, "assets": assets},
          f"wrote {path} (version {args.version}, {'signed' if key else 'UNSIGNED'}) with {plural(len(targets), 'target')}: {', '.join(targets)}")
    return 0



def _build_dir(value: str) -> Path:
    """``manifest build``'s DIR: a folder that exists (a missing input is a usage error) and takes
    the manifest (and its signature, and with --flat the copies), said before any wheel is hashed."""
    directory = Path(value).expanduser()
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is not a folder"
        raise UsageError(f"the build folder {value} {what}",
                         "name the folder the builds were written to (`accelstack build ggml --out DIR/...`)")
    check_output_path(directory / "ggml-manifest.json", "the manifest", parents=False)
    return directory


def _emit(args: argparse.Namespace, data: dict, text: str) -> None:
    emit(args, data, text)


def run_keygen(args: argparse.Namespace) -> int:
    prefix = Path(args.out).expanduser()
    for suffix, what in ((".key", "the private key"), (".pub", "the public key")):  # before a key is made
        check_output_path(prefix.with_name(prefix.name + suffix), what)
    pair = manifest_tools.keygen(prefix, force=args.force)
    _emit(
        args,
        {"keyid": pair.keyid, "private_key": str(pair.private_key), "public_key": str(pair.public_key)},
        f"key id {pair.keyid}\n  private key: {pair.private_key} (keep it secret, mode 0600)\n  public key:  "
        f"{pair.public_key} (publish it; users put it in {_user_keys_dir()})",
    )
    return 0


def run_sign(args: argparse.Namespace) -> int:
    manifest = Path(args.manifest)
    out = Path(args.out).expanduser() if args.out else None
    if manifest.is_file():  # (a missing manifest is said by sign, as a missing input)
        check_output_path(out or manifest.with_name(manifest.name + ".sig"), "the signature", parents=False)
    signed = manifest_tools.sign(manifest, args.key, out=out,
                                 replace=args.replace, allow_expired=args.allow_expired)
    envelope = signed.envelope
    _emit(
        args,
        {"manifest": str(signed.manifest), "signature": str(signed.signature), "keyid": signed.keyid,
         "source": envelope.source, "version": envelope.version, "expires": as_utc_z(envelope.expires)},
        f"signed {signed.manifest} ({envelope.source} version {envelope.version}, expires {envelope.expires}) "
        f"with key {signed.keyid}\n  signature: {signed.signature}",
    )
    return 0


def run_verify(args: argparse.Namespace) -> int:
    checked = manifest_tools.verify(Path(args.manifest), settings_from_args(args), sig=args.sig, keys=args.key,
                                    only_keys=args.only_keys, insecure_unsigned=args.insecure_unsigned,
                                    rollback=not args.no_rollback, record=args.record)
    result, env, manifest = checked.result, checked.result.envelope, checked.manifest
    _emit(
        args,
        {"ok": True, "manifest": str(manifest), "source": env.source, "version": env.version,
         "kind": env.kind, "expires": as_utc_z(env.expires), "signed": result.signed, "keyid": result.keyid},
        f"OK: {manifest}: {env.source} version {env.version} ({env.kind}), expires {env.expires}, "
        f"signed by {checked.signer}",
    )
    return 0
