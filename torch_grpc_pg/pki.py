"""A throwaway certificate authority and one rank certificate, for trying TLS on one machine.

    python -m torch_grpc_pg.pki DIRECTORY     # prints the TORCH_GRPC_PG_TLS_* variables to export

The certificate is valid for two days, for localhost, this host's name and 127.0.0.1, and
every rank of the test shares it. For a real job, certificates come from your own CA.
Needs the `openssl` command.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path


def make_local_pki(directory: Path) -> dict[str, str]:
    """Writes ca.pem, rank.pem and rank.key into `directory`; returns the variables that
    point a rank at them (mutual TLS), with the rank advertising 127.0.0.1."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(
            ["openssl", *args], check=True, capture_output=True, cwd=directory
        )

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem",
    )  # fmt: skip
    names = f"DNS:localhost,DNS:{socket.gethostname()},IP:127.0.0.1"
    (directory / "ext.cnf").write_text(f"subjectAltName={names}\n")
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=rank",
        "-keyout", "rank.key", "-out", "rank.csr",
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", "rank.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf", "-out", "rank.pem",
    )  # fmt: skip
    return {
        "TORCH_GRPC_PG_TLS_CERT": str(directory / "rank.pem"),
        "TORCH_GRPC_PG_TLS_KEY": str(directory / "rank.key"),
        "TORCH_GRPC_PG_TLS_CA": str(directory / "ca.pem"),
        "TORCH_GRPC_PG_ADVERTISE_HOST": "127.0.0.1",
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for name, value in make_local_pki(Path(args[0]).resolve()).items():
        print(f"export {name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
