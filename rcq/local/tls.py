"""A throwaway certificate authority for loopback clusters: a CA and one certificate per node.

A cluster started with ``tls=True`` (:class:`rcq.local.cluster.LocalCluster`) serves HTTPS
with certificates issued here, so that clients verify them the way they would in production:
against a CA file (``RcqClient(ca_file=...)``, ``RCQ_CA_FILE``), never by turning checks off.
Each certificate names ``127.0.0.1`` (an IP SAN: the URLs are ``https://127.0.0.1:PORT``) and
``localhost``, and may serve as a server and as a client certificate (nodes present theirs to
peers that require one; a test may issue one to a client for mutual TLS).

Keys are EC P-256 (generated in milliseconds, unlike RSA), written unencrypted but readable by
their owner only (:func:`rcq.private_files.write_private`: the node refuses a key file others
may read); certificates are public. Everything is made with the ``cryptography`` package
(already installed with the server, which pysyncobj needs).

Must not import: rcq.server, pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rcq.private_files import write_private

VALIDITY = datetime.timedelta(days=365)  # a kept cluster (--data-dir) is reopened for a year
CLOCK_SKEW = datetime.timedelta(hours=1)  # valid from a little before now
DEFAULT_HOSTS = ("127.0.0.1", "localhost")
CA_NAME = "ca"


class CertFiles(NamedTuple):
    """A PEM certificate and its PEM private key (mode 0600); as a pair, what
    ``RcqClient(client_cert=...)`` takes."""

    cert: Path
    key: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(files: CertFiles, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    write_private(files.key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()).decode("ascii"))
    files.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def _validity() -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - CLOCK_SKEW, now + VALIDITY


def _subject_alternative_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def write_ca(directory: Path, name: str = CA_NAME) -> CertFiles:
    """A self-signed CA in ``directory`` (``<name>.pem``, ``<name>.key``); it signs certificates only."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"rcq test CA {name}")])
    not_before, not_after = _validity()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    files = CertFiles(directory / f"{name}.pem", directory / f"{name}.key")
    _write(files, certificate, key)
    return files


def write_certificate(ca: CertFiles, directory: Path, name: str, hosts: Sequence[str] = DEFAULT_HOSTS) -> CertFiles:
    """A certificate for ``hosts`` signed by ``ca``, in ``directory`` (``<name>.pem``, ``<name>.key``);
    good for TLS servers and clients alike."""
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{ca.key}: not an EC key made by rcq.local.tls")
    ca_certificate = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    key = _new_key()
    not_before, not_after = _validity()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectAlternativeName(_subject_alternative_names(hosts)), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files = CertFiles(directory / f"{name}.pem", directory / f"{name}.key")
    _write(files, certificate, key)
    return files
