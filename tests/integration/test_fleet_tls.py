"""The Prometheus client over TLS, against a certificate made by openssl (moved from the unit tests)."""

from __future__ import annotations

import subprocess
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from diagnose.collectors.promapi import Auth, PromApi, PromApiError
from tests.unit.test_fleet import SECRET, WantsToken

pytestmark = pytest.mark.integration


@pytest.fixture
def tls_cert(tmp_path: Path) -> tuple[str, str]:
    import shutil as _shutil

    if _shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


def test_tls_is_verified_against_the_given_ca_or_skipped_when_asked(tls_cert: tuple[str, str]) -> None:
    import ssl

    cert, key = tls_cert
    srv = ThreadingHTTPServer(("127.0.0.1", 0), WantsToken)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    url = f"https://127.0.0.1:{srv.server_address[1]}"
    auth = Auth(token=SECRET, origin="a file")
    try:
        with pytest.raises(PromApiError) as err:
            PromApi(url, auth=auth, timeout_s=10).query("up", 0.0)
        assert err.value.kind == "tls" and "--ca-file" in err.value.remedy
        assert PromApi(url, auth=auth, ca_file=cert, timeout_s=10).query("up", 0.0)[0]["value"] == [1.0, "3"]
        assert PromApi(url, auth=auth, insecure=True, timeout_s=10).query("up", 0.0)
    finally:
        srv.shutdown()
        srv.server_close()

