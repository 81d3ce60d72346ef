"""``train --scheduler tls://...``: dask's TLS, passed through to the client (a real
LocalCluster of one worker process on TLS, with a self-signed certificate made by openssl)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from napari_finetune.loading import load_checkpoint
from test_cli import TRAIN_FAST, assert_one_line_error, run_cli

pytestmark = [
    pytest.mark.resource,  # a LocalCluster of worker processes
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl for a certificate"),
]


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """(scheduler address, certificate, key) of a TLS LocalCluster."""
    from distributed import Client, LocalCluster, Security

    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    security = Security(tls_ca_file=str(cert), tls_scheduler_cert=str(cert),
                        tls_scheduler_key=str(key), tls_worker_cert=str(cert),
                        tls_worker_key=str(key), tls_client_cert=str(cert),
                        tls_client_key=str(key), require_encryption=True)
    cluster = LocalCluster(processes=True, n_workers=1, threads_per_worker=1,
                           protocol="tls://", security=security, dashboard_address=":0")
    with Client(cluster, security=security):  # the worker is up before the tests
        pass
    yield cluster.scheduler_address, cert, key
    cluster.close()


def test_train_over_tls(capsys, tmp_path, painted_store, checkpoint, tls):
    address, cert, key = tls
    assert address.startswith("tls://")
    code, stdout, err = run_cli(
        capsys, "train", painted_store, "-c", checkpoint, "-o", tmp_path / "o.pt",
        "--steps", "2", *TRAIN_FAST, "--scheduler", address,
        "--tls-ca-file", cert, "--tls-cert", cert, "--tls-key", key,
    )
    assert code == 0, err
    assert "finished after 2/2 steps" in stdout
    assert load_checkpoint(tmp_path / "o.pt").metadata["run"]["steps_done"] == 2


def test_train_over_tls_without_the_certificates_is_one_line(capsys, tmp_path, painted_store,
                                                             checkpoint, tls):
    address, _, _ = tls
    code, _, err = run_cli(capsys, "train", painted_store, "-c", checkpoint, "-o",
                           tmp_path / "o.pt", "--steps", "2", *TRAIN_FAST, "--scheduler", address)
    assert_one_line_error(code, err)
    # The hint, not only the address: "cannot reach the dask scheduler at ..." would match that.
    assert f"the dask scheduler at {address} speaks TLS" in err
    assert "--tls-ca-file, --tls-cert, --tls-key" in err and "cannot reach" not in err
