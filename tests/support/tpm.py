"""A software TPM 2.0 (swtpm) on loopback with a provisioned attestation key: one per node under test.

`swtpm socket --tpm2` serves the TPM command port and a control port on 127.0.0.1 with its state in a
temporary directory (`--flags startup-clear`: the TPM is started, PCRs reset). The node's ECC endorsement
key and ECDSA P-256 attestation key are created with tpm2-tools (`tpm2_createek`, `tpm2_createak`) and the AK
is made persistent at `DEFAULT_AK_HANDLE`, as an operator provisions a node (docs/load-receipts.md).

swtpm serves one client at a time, and a crashed client leaves its transient objects loaded. So where Debian
`tpm2-abrmd`, `dbus-daemon` and the `tabrmd` TCTI (`libtss2-tcti-tabrmd0`) are installed, clients reach it
through the access broker as a node's clients do: `private_dbus` starts a session bus of its own (a temporary
configuration listening in a temporary directory; `$DBUS_SESSION_BUS_ADDRESS` set for the test process), and
`tpm2-abrmd --session` owns a name of its own on it, in front of each swtpm (`tcti` is then
`tabrmd:bus_name=...,bus_type=session`). Without them clients use the `swtpm:` TCTI directly, serialised by
`TpmAttestationKey`, which flushes the transient objects it leaves. Missing binaries skip, naming the Debian
packages.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from modelsec.signer.tpm import DEFAULT_AK_HANDLE, TpmAttestationKey

_TOOLS = ("swtpm", "tpm2_createek", "tpm2_createak", "tpm2_evictcontrol", "tpm2_quote", "tpm2_pcrextend")


def tpm_missing_reason() -> str | None:
    """Why the TPM tests cannot run here, or None."""
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian swtpm, tpm2-tools): the TPM receipt tests skip"
    return None


def abrmd_missing_reason() -> str | None:
    """Why swtpm is reached without tpm2-abrmd here, or None."""
    missing = [t for t in ("tpm2-abrmd", "dbus-daemon") if shutil.which(t) is None]
    if not glob.glob("/usr/lib/*/libtss2-tcti-tabrmd.so*"):
        missing.append("the tabrmd TCTI (libtss2-tcti-tabrmd0)")
    return f"{', '.join(missing)} not installed" if missing else None


_BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:dir={dir}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""


@contextmanager
def private_dbus(state: Path) -> Iterator[str]:
    """A D-Bus session bus of its own, listening in `state`; yields its address (stopped on exit)."""
    state.mkdir(parents=True, exist_ok=True)
    (state / "bus.conf").write_text(_BUS_CONFIG.format(dir=state))
    proc = subprocess.Popen(
        ["dbus-daemon", "--nofork", f"--config-file={state / 'bus.conf'}", "--print-address=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        address = proc.stdout.readline().decode().strip() if proc.stdout is not None else ""
        if not address:
            raise RuntimeError("dbus-daemon printed no address")
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def _abrmd(state: Path, swtpm_tcti: str, port: int) -> Iterator[str]:
    """tpm2-abrmd on the bus `$DBUS_SESSION_BUS_ADDRESS` names, in front of `swtpm_tcti`; yields its TCTI."""
    name = f"dev.modelsec.Tabrmd.p{os.getpid()}.t{port}"
    argv = ["tpm2-abrmd", "--session", f"--dbus-name={name}", f"--tcti={swtpm_tcti}", "--flush-all"]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    log = (state / "abrmd.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    tcti = f"tabrmd:bus_name={name},bus_type=session"
    try:
        deadline = time.monotonic() + 10
        env = {"TPM2TOOLS_TCTI": tcti, "PATH": "/usr/bin:/bin", **_bus_env()}
        while subprocess.run(["tpm2_getrandom", "8"], env=env, capture_output=True, check=False).returncode:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"tpm2-abrmd did not start: {(state / 'abrmd.log').read_text()}")
            time.sleep(0.05)
        yield tcti
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _bus_env() -> dict[str, str]:
    bus = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
    return {"DBUS_SESSION_BUS_ADDRESS": bus} if bus else {}


@dataclass(frozen=True)
class SoftwareTpm:
    """A running swtpm with a provisioned AK.

    Attributes:
        tcti: The `swtpm:` TCTI string to reach it.
        ak_pem: The AK's public key file (what an operator registers as a node key).
        ak: The AK, as the node uses it.
        ctrl_port: swtpm's control port.
    """

    tcti: str
    ak_pem: Path
    ak: TpmAttestationKey
    ctrl_port: int

    def tools(self, *args: str) -> bytes:
        """Run a tpm2-tools command against this TPM (e.g. `tpm2_pcrextend` to change the boot state)."""
        env = {"TPM2TOOLS_TCTI": self.tcti, "PATH": "/usr/bin:/bin", **_bus_env()}
        return subprocess.run(args, check=True, capture_output=True, env=env).stdout

    def pcr(self, index: int) -> str:
        """The SHA-256 bank value of PCR `index`, hex (what an operator records from a known-good boot)."""
        with tempfile.TemporaryDirectory() as tmp:
            self.tools("tpm2_pcrread", f"sha256:{index}", "-o", f"{tmp}/pcr.bin")
            return (Path(tmp) / "pcr.bin").read_bytes().hex()


def _free_ports() -> int:
    """A port P such that P and P+1 are free on loopback (swtpm's server and control ports)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no two adjacent free ports")


@contextmanager
def run_swtpm(state: Path, *, broker: bool = False) -> Iterator[SoftwareTpm]:
    """Start swtpm in `state`, provision its EK and AK, and stop it on exit.

    `broker`: put tpm2-abrmd in front of it, on the session bus `$DBUS_SESSION_BUS_ADDRESS` names (see
    `private_dbus`); `tcti` is then the broker's.
    """
    port = _free_ports()
    tpmstate = state / "tpmstate"
    tpmstate.mkdir(parents=True)
    log = (state / "swtpm.log").open("wb")
    proc = subprocess.Popen(
        [
            "swtpm", "socket", "--tpm2",
            "--server", f"type=tcp,port={port},bindaddr=127.0.0.1",
            "--ctrl", f"type=tcp,port={port + 1},bindaddr=127.0.0.1",
            "--tpmstate", f"dir={tpmstate}", "--flags", "startup-clear,not-need-init",
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"swtpm did not start: {(state / 'swtpm.log').read_text()}") from None
                time.sleep(0.05)
        with ExitStack() as stack:
            tcti = f"swtpm:host=127.0.0.1,port={port}"
            if broker:
                tcti = stack.enter_context(_abrmd(state, tcti, port))
            tpm = SoftwareTpm(
                tcti, state / "ak.pub.pem", TpmAttestationKey(DEFAULT_AK_HANDLE, tcti=tcti), port + 1
            )
            ek, ak = str(state / "ek.ctx"), str(state / "ak.ctx")
            tpm.tools("tpm2_createek", "-c", ek, "-G", "ecc", "-u", str(state / "ek.pub"))
            tpm.tools("tpm2_flushcontext", "-t")
            tpm.tools(
                "tpm2_createak", "-C", ek, "-c", ak, "-G", "ecc", "-g", "sha256", "-s", "ecdsa",
                "-u", str(tpm.ak_pem), "-f", "pem",
            )  # fmt: skip
            tpm.tools("tpm2_flushcontext", "-t")
            tpm.tools("tpm2_flushcontext", "-s")
            tpm.tools("tpm2_evictcontrol", "-C", "o", "-c", ak, hex(DEFAULT_AK_HANDLE))
            tpm.tools("tpm2_flushcontext", "-t")
            yield tpm
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
