"""Build hooks only; the project itself is declared in pyproject.toml.

Installs the runtime guard's start-up file `modelsec-guard.pth` at the root of site-packages, where `site`
processes it in every interpreter start (see modelsec/verifier/_boot.py). setuptools has no declarative
way to place a file there (the approach of pytest-cov's `pytest-cov.pth` and pytest-socket's `.pth`):

* wheels (`pip install .`, `pip wheel .`): `build_py` also copies it to the root of build_lib;
* editable installs (PEP 660, lenient and `editable_mode=strict`): setuptools builds the editable wheel
  without build_lib, so `editable_wheel` adds the file, with its RECORD line, to the wheel it built.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel
from setuptools.errors import SetupError

# Kept in the repository as `.pth.in` (a `.pth` in a source tree reads as a pickle checkpoint to scanners).
PTH = Path(__file__).resolve().parent / "verifier" / "guard" / "modelsec-guard.pth.in"
PTH_NAME = "modelsec-guard.pth"


class build_py_with_pth(build_py):
    """build_py that also puts the start-up `.pth` at the root of build_lib (so of the wheel)."""

    def run(self) -> None:
        """Build the packages, then copy the `.pth` (not in editable mode: editable_wheel adds it)."""
        super().run()
        if not self.editable_mode:
            self.copy_file(str(PTH), os.path.join(self.build_lib, PTH_NAME), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        """The files `run` writes, the `.pth` included."""
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs.append(os.path.join(self.build_lib, PTH_NAME))
        return outputs


class editable_wheel_with_pth(editable_wheel):
    """editable_wheel that adds the start-up `.pth` (and its RECORD line) to the editable wheel."""

    def run(self) -> None:
        """Build the editable wheel, then add the `.pth` to it.

        Raises:
            SetupError: Not exactly one wheel was written in dist_dir, or it already holds the `.pth`.
        """
        dist_dir = Path(self.dist_dir)
        before = {p: _identity(p) for p in dist_dir.glob("*.whl")}
        super().run()
        built = [p for p in dist_dir.glob("*.whl") if before.get(p) != _identity(p)]
        if len(built) != 1:
            raise SetupError(f"{dist_dir}: expected one new editable wheel, found {sorted(map(str, built))}")
        _add_to_wheel(built[0], PTH_NAME, PTH.read_bytes())


def _identity(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def _add_to_wheel(wheel: Path, name: str, data: bytes) -> None:
    """Rewrite `wheel` with `name` at its root and a RECORD line for it (RECORD lists every file)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    tmp = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        infos = src.infolist()
        if any(i.filename == name for i in infos):
            raise SetupError(f"{wheel}: already holds {name}")
        (record,) = [
            i for i in infos if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/RECORD")
        ]
        # The .dist-info directory stays last in the archive, as the wheel spec recommends.
        body = [i for i in infos if ".dist-info/" not in i.filename]
        meta = [i for i in infos if ".dist-info/" in i.filename and i is not record]
        for info in body:
            dst.writestr(info, src.read(info))
        pth = zipfile.ZipInfo(name, date_time=record.date_time)
        pth.external_attr = 0o644 << 16
        dst.writestr(pth, data, zipfile.ZIP_DEFLATED)
        for info in meta:
            dst.writestr(info, src.read(info))
        rows = src.read(record).decode()
        if rows and not rows.endswith("\n"):
            rows += "\n"
        dst.writestr(record, f"{rows}{name},sha256={digest},{len(data)}\n")
    os.replace(tmp, wheel)


setup(cmdclass={"build_py": build_py_with_pth, "editable_wheel": editable_wheel_with_pth})
