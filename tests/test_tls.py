"""`serving.tls_cert`/`tls_key`: HTTPS only, with a certificate the test makes; rotation
without a restart; a missing or mismatched pair refuses to start, naming the file."""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
import socket
import ssl
import time
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from blazar.testing.ports import free_port
from blazar.testing.tiny import is_tiny_text, write_tiny_model
from tests.conftest import run_blazar
from tests.fixtures import ENGINE, model_block, write_manifest
from tests.serving import Served

KEY = "plm_tls-" + "d" * 40
HI = [{"role": "user", "content": "hello"}]


CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def make_ca(folder: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("blazar test CA"))
        .issuer_name(_name("blazar test CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path = folder / "ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key, path


def make_leaf(
    folder: Path, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, stem: str
) -> tuple[Path, Path, bytes]:
    """A server certificate for 127.0.0.1 and localhost: (cert file, key file, its DER)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path, cert.public_bytes(serialization.Encoding.DER)


def presented(port: int, ca: Path) -> bytes:
    """The certificate a new TLS connection to the gateway is shown (DER)."""
    context = ssl.create_default_context(cafile=str(ca))
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def tls_manifest(tmp_path: Path, model: Path, cert: Path, key: Path) -> Path:
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    text = f'[serving]\ntls_cert = "{cert}"\ntls_key = "{key}"\n\n' + ENGINE
    text += model_block("tiny", model) + f'[keys.ops]\nsha256 = "{sha}"\nscope = "admin"\n'
    return write_manifest(tmp_path, text)


def test_https_only_with_the_official_clients_and_rotation(
    tmp_path: Path, blazar_home: Path
) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf")
    tls = tmp_path / "tls"
    tls.mkdir()
    ca, ca_key, ca_path = make_ca(tls)
    cert, key, first = make_leaf(tls, ca, ca_key, "server")
    manifest = tls_manifest(tmp_path, model, cert, key)
    with Served(manifest, blazar_home) as served:
        assert f"Blazar is serving on https://127.0.0.1:{served.port}" in served.log
        url = f"https://127.0.0.1:{served.port}"
        verify = ssl.create_default_context(cafile=str(ca_path))
        oai = openai.OpenAI(
            base_url=f"{url}/v1",
            api_key=KEY,
            max_retries=0,
            http_client=httpx.Client(verify=verify),
        )
        chat = oai.chat.completions.create(model="tiny", messages=HI, max_tokens=4)
        assert is_tiny_text(chat.choices[0].message.content or "", allow=())
        anth = anthropic.Anthropic(
            base_url=url,
            api_key=KEY,
            max_retries=0,
            http_client=anthropic.DefaultHttpxClient(verify=verify),
        )
        assert anth.messages.create(model="tiny", max_tokens=4, messages=HI).content
        olla = ollama.Client(host=url, headers={"Authorization": f"Bearer {KEY}"}, verify=verify)
        assert [m.model for m in olla.list().models] == ["tiny:latest"]
        with pytest.raises(openai.AuthenticationError):  # TLS does not replace the key
            openai.OpenAI(
                base_url=f"{url}/v1",
                api_key="plm_wrong",
                max_retries=0,
                http_client=httpx.Client(verify=verify),
            ).models.list()
        # Plain HTTP on the TLS port gets no answer at all, not even an error page.
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{served.port}/health", timeout=10)
        with pytest.raises(httpx.ConnectError):  # and a client that checks meets a stranger
            httpx.get(f"{url}/health", timeout=10)
        assert presented(served.port, ca_path) == first
        # Rotation: new files in place; the next pass (a manifest change, or the timer)
        # loads them into the same listener, and new connections get the new certificate.
        new_cert, new_key, second = make_leaf(tls, ca, ca_key, "rotated")
        os.replace(new_cert, cert)
        os.replace(new_key, key)
        manifest.write_text(manifest.read_text() + "\n# rotated\n")
        deadline = dt.datetime.now() + dt.timedelta(seconds=30)
        while presented(served.port, ca_path) != second:
            assert dt.datetime.now() < deadline, "the rotated certificate was not loaded"
            time.sleep(0.2)
        assert "TLS certificate reloaded" in served.log
        assert oai.models.list().data  # connections keep working across the rotation


def test_a_missing_or_mismatched_pair_refuses_to_start_naming_the_file(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny.gguf")
    ca, ca_key, _ = make_ca(tmp_path)
    cert, key, _ = make_leaf(tmp_path, ca, ca_key, "one")
    _, other_key, _ = make_leaf(tmp_path, ca, ca_key, "two")
    cases = [
        (tmp_path / "absent.crt", key, "serving.tls_cert", "absent.crt", "cannot read it"),
        (cert, tmp_path / "absent.key", "serving.tls_key", "absent.key", "cannot read it"),
        (cert, other_key, "serving.tls_key", "two.key", "does not match"),
        (key, key, "serving.tls_cert", "one.key", "no PEM certificate"),
    ]
    for cert_file, key_file, field, name, why in cases:
        manifest = tls_manifest(tmp_path, model, cert_file, key_file)
        result = run_blazar("serve", str(manifest), "--port", "1")
        assert result.returncode == 1, result.stderr
        assert field in result.stderr and name in result.stderr and why in result.stderr
        assert "Blazar is serving" not in result.stdout


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A self-signed pair for 127.0.0.1, as `openssl req -x509` makes one: the certificate
    is its own and only anchor."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "blazar-box")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "self.crt", folder / "self.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def test_the_cli_finds_and_trusts_an_https_daemon_from_the_manifest(
    tmp_path: Path, blazar_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `serving.tls_cert/tls_key` a self-signed pair, the CLI said "no Blazar daemon
    answers" while serve ran (it worked only with SSL_CERT_FILE), and with serve stopped it
    named http://127.0.0.1:11435 while the manifest said https on another port. It reads
    the address, scheme and certificate serve uses (issue 33, day one 6)."""
    cert, key = self_signed(tmp_path)
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    port = free_port()
    manifest = blazar_home / "config" / "blazar.toml"  # the user's manifest
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(
        f'[serving]\nport = {port}\ntls_cert = "{cert}"\ntls_key = "{key}"\n\n'
        f'[keys.ops]\nsha256 = "{sha}"\nscope = "admin"\n'
    )
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # the certificate is trusted by no one
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    env = {"BLAZAR_API_KEY": KEY, "BLAZAR_URL": ""}
    stopped = run_blazar("ps", env=env)
    assert stopped.returncode != 0
    assert f"no Blazar daemon answers at https://127.0.0.1:{port}" in stopped.stderr
    with Served(manifest, blazar_home):
        listed = run_blazar("ps", env=env)
        assert listed.returncode == 0, listed.stderr
        assert "no Blazar daemon" not in listed.stderr
