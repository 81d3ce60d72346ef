"""Before a remote run starts: the scheduler is reachable, a worker has what the run asks
for, and its versions are this machine's. Each failure is one line naming the fix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from napari_finetune.errors import first_line

if TYPE_CHECKING:
    from distributed import Client, Security

# How long a scheduler may take to answer before the run is refused.
CONNECT_TIMEOUT_S = 5.0


class RemoteError(RuntimeError):
    """A remote run cannot start or went wrong; the message is one line naming the fix."""


def require_distributed() -> None:
    """Raise :class:`RemoteError` (one line) when dask.distributed is not installed."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise RemoteError(
            "training on a dask scheduler needs dask.distributed: "
            "pip install 'napari-finetune[distributed]'"
        ) from None


def connect(address: str, security: Security | None = None,
            timeout_s: float = CONNECT_TIMEOUT_S) -> Client:
    """A client of the scheduler at ``address``; :class:`RemoteError` when it does not answer."""
    require_distributed()
    from distributed import Client

    try:
        return Client(address, timeout=f"{timeout_s}s", security=security,
                      set_as_default=False)
    except TypeError as exc:  # dask's way of saying a tls:// address got no certificates
        raise RemoteError(
            f"the dask scheduler at {address} speaks TLS ({first_line(exc)}); give its "
            "certificates (--tls-ca-file, --tls-cert, --tls-key or dask's distributed.comm.tls)."
        ) from None
    except MemoryError:  # another server's answer read as a dask frame's length
        raise RemoteError(
            f"the server at {address} answered, but not as a dask scheduler; check the "
            "address and the port (the one `dask scheduler` printed)."
        ) from None
    except (OSError, TimeoutError, ValueError) as exc:
        raise RemoteError(
            f"cannot reach the dask scheduler at {address} within {timeout_s:g} s "
            f"({first_line(exc)}); start one (dask scheduler) or check the address."
        ) from None


def is_loopback(address: str) -> bool:
    """Whether the scheduler ``address`` names this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: another machine, as far as this one knows
        return False


def unencrypted_line(address: str) -> str | None:
    """The warning for a plain ``tcp://`` (or scheme-less) address of another machine:
    what travels unencrypted and how to use TLS; None for ``tls://`` or this machine."""
    scheme = address.split("://", 1)[0].lower() if "://" in address else "tcp"
    if scheme != "tcp" or is_loopback(address):
        return None
    return (f"{address} is not encrypted: the checkpoint, the painted tiles and the weights "
            "travel in the clear over the network; use the scheduler's tls:// address with "
            "--tls-ca-file, --tls-cert and --tls-key (or dask's distributed.comm.tls).")


def resources_for(device: str) -> dict[str, float]:
    """The dask resources a run on ``device`` asks for: one GPU unless the CPU was chosen
    ("auto" too: a worker's GPU is what a remote run is for)."""
    return {} if device == "cpu" else {"GPU": 1}


def eligible_workers(client: Client, resources: Mapping[str, float], address: str) -> list[str]:
    """The workers that offer ``resources`` (maybe none: the run then waits in the queue
    for one); :class:`RemoteError` when the scheduler has no workers at all."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    if not workers:
        raise RemoteError(
            f"the dask scheduler at {address} has no workers; start one (dask worker {address})."
        )
    return [
        worker for worker, info in workers.items()
        if all(float((info.get("resources") or {}).get(k, 0)) >= v for k, v in resources.items())
    ]


def asked(resources: Mapping[str, float]) -> str:
    """``resources`` as dask's ``--resources`` writes them (``GPU=1``)."""
    return ",".join(f"{k}={v:g}" for k, v in resources.items())


def version_mismatch(there_name: str, there: Mapping[str, str], here_name: str,
                     here: Mapping[str, str]) -> str | None:
    """One line naming both sides when ``there`` differs from ``here`` (torch, the
    napari-finetune release or its build); None when they agree."""
    if all(there.get(k) == v for k, v in here.items()):
        return None

    def said(found: Mapping[str, str]) -> str:
        return (f"torch {found.get('torch')}, napari-finetune {found.get('napari_finetune')} "
                f"(build {found.get('napari_finetune_build')})")

    return (f"{there_name} has {said(there)} but {here_name} has {said(here)}; "
            "install the same versions and code on both.")


def matching_versions(client: Client, workers: list[str], here: Mapping[str, str]) -> list[str]:
    """Those of ``workers`` whose torch, napari-finetune and its build are ``here``'s;
    :class:`RemoteError` naming both sides when none is."""
    from napari_finetune.remote.build import versions

    found: dict[str, dict[str, str]] = client.run(versions, workers=workers)
    same = [w for w, v in found.items() if all(v.get(k) == here[k] for k in here)]
    if not same:
        worker, theirs = next(iter(found.items()))
        line = version_mismatch(f"the worker {worker}", theirs, "this machine", here)
        raise RemoteError(line)
    return same


def tls_security(ca_file: str, cert: str, key: str) -> Security:
    """dask's ``Security`` for a client that talks TLS only: the CA that signed the
    scheduler's certificate, this client's certificate and its private key (PEM files)."""
    require_distributed()
    from distributed import Security

    return Security(tls_ca_file=ca_file, tls_client_cert=cert, tls_client_key=key,
                    require_encryption=True)
