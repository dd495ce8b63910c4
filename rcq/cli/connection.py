"""How a client verb reaches the cluster: the flags every client verb shares, the nodes' URLs, the
token, TLS, and one :class:`~rcq.client.RcqClient` for the verb's run.

The token comes from ``--token-file`` or ``RCQ_TOKEN``, never from an argument (process lists show
arguments); HTTPS nodes are verified against ``--ca-file`` or ``RCQ_CA_FILE`` (default: the
system's CAs).

Must not import: rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rcq.cli.tokens import TOKEN_CHARACTERS
from rcq.errors import InvalidRequest
from rcq.private_files import check_private, read_private


def seconds(text: str) -> float:
    """A number of seconds (an argument type); NaN and infinity are refused here (JSON has no form for them)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    return value


def client_flags() -> argparse.ArgumentParser:
    """The flags of every client verb (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", action="append", default=None,
                        help="a node's URL, e.g. http://127.0.0.1:7001 (repeat; default: $RCQ_URLS, comma-separated)")
    common.add_argument("--json", action="store_true", help="print JSON for machines")
    common.add_argument("--retry-timeout-s", type=float, default=15.0,
                        help="how long to keep retrying while the cluster fails over (default 15)")
    security = common.add_argument_group("security")
    security.add_argument("--token-file", type=Path, default=None,
                          help="file holding the API token, mode 0600 (default: $RCQ_TOKEN; never the token itself "
                               "as an argument: process lists show arguments)")
    security.add_argument("--ca-file", type=Path, default=None,
                          help="verify HTTPS nodes against this CA bundle (default: $RCQ_CA_FILE, else the system's CAs)")
    security.add_argument("--client-cert", type=Path, default=None,
                          help="PEM certificate to present to nodes that require client certificates")
    security.add_argument("--client-key", type=Path, default=None,
                          help="its private key, mode 0600 (default: in the --client-cert file)")
    return common


def _urls(args: argparse.Namespace) -> list[str]:
    urls = [u for given in (args.url or []) for u in given.split(",") if u.strip()]
    if not urls:
        urls = [u for u in os.environ.get("RCQ_URLS", "").split(",") if u.strip()]
    if not urls:
        raise InvalidRequest("no node URL: pass --url or set RCQ_URLS")
    return urls


def _token(args: argparse.Namespace) -> str | None:
    """The token of ``--token-file`` (None: RcqClient falls back to $RCQ_TOKEN). Messages never show it."""
    if args.token_file is None:
        return None
    token = read_private(args.token_file, "token")
    if not TOKEN_CHARACTERS.match(token):
        raise InvalidRequest(f"the token file {args.token_file} must hold one token (printable characters, "
                             "no spaces) and nothing else")
    return token


def client_security(args: argparse.Namespace) -> dict[str, Any]:
    """RcqClient's ``token``, ``ca_file`` and ``client_cert`` from the flags and the environment."""
    if args.client_key is not None and args.client_cert is None:
        raise InvalidRequest("--client-key goes with --client-cert")
    security: dict[str, Any] = {"token": _token(args),
                                "ca_file": args.ca_file or os.environ.get("RCQ_CA_FILE") or None}
    if args.client_cert is not None:
        key = args.client_key or args.client_cert
        check_private(key, "client key")
        security["client_cert"] = (args.client_cert, key)
    return security


def with_client(args: argparse.Namespace, verb: Callable[[Any], Awaitable[int]]) -> int:
    """Run ``verb(client)`` in its own event loop, with a client made from the flags; its exit code."""
    from rcq.client import RcqClient

    urls, security = _urls(args), client_security(args)
    files = ", ".join(str(f) for f in (security["ca_file"], *security.get("client_cert", ())) if f is not None)

    async def run() -> int:
        try:
            client = RcqClient(urls, retry_timeout_s=args.retry_timeout_s, **security)
        except OSError as exc:  # ssl.SSLError too: a CA, certificate or key file that cannot be used
            raise InvalidRequest(f"cannot use the TLS files ({files}): {exc}") from None
        async with client:
            return await verb(client)

    return asyncio.run(run())
