"""Builds torch_grpc_pg._C.

The extension is compiled in two parts with different include paths. torch's
include directory ships protobuf headers of another version than the system's
libprotobuf, so the transport and algorithm sources (which never include torch)
are compiled first against the system's gRPC and protobuf alone; the backend
glue is then compiled against torch and linked with them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
PROTO = ROOT / "protos" / "torch_grpc_pg.proto"
GENERATED = ROOT / "build" / "generated"
PY_PROTO = ROOT / "torch_grpc_pg" / "_proto"
WARNINGS = ["-Wall", "-Wno-unused-parameter"]


def torch_cxx11_abi() -> int:
    """torch's std::string ABI, which the torch-free objects must share: strings
    and structs holding them cross from the glue into them."""
    # Releases from 2.7 on are built with the C++11 ABI only; later ones may drop the flag.
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    if not abi:
        # The torch-free objects also pass strings to gRPC and protobuf, which
        # Debian builds with the C++11 ABI: no setting can suit both sides.
        sys.exit(
            f"torch {torch.__version__} is built with the pre-C++11 std::string ABI "
            "(_GLIBCXX_USE_CXX11_ABI=0), the system's gRPC and protobuf with the C++11 one. "
            "Use torch 2.7 or later."
        )
    return abi


# torch's headers choose the C++ standard of the glue; the rest is plain C++17.
TORCH_FREE_FLAGS = [
    "-std=c++17",
    "-O3",
    "-fPIC",
    f"-D_GLIBCXX_USE_CXX11_ABI={torch_cxx11_abi()}",
    *WARNINGS,
]
GLUE_FLAGS = ["-O3", *WARNINGS]


def pkg_config(*args: str) -> list[str]:
    try:
        out = subprocess.check_output(
            ["pkg-config", *args, "grpc++", "protobuf", "libcrypto"], text=True
        )
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(
            "torch-grpc-pg needs gRPC C++ and protobuf development files, found through pkg-config.\n"
            "On Debian/Ubuntu: apt-get install libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev "
            f"protobuf-compiler pkg-config\n({e})"
        )
    return shlex.split(out)


def is_stale(target: Path, *sources: Path) -> bool:
    return not target.exists() or any(
        s.stat().st_mtime > target.stat().st_mtime for s in sources
    )


def generate_cpp() -> list[Path]:
    GENERATED.mkdir(parents=True, exist_ok=True)
    outputs = [
        GENERATED / "torch_grpc_pg.pb.cc",
        GENERATED / "torch_grpc_pg.grpc.pb.cc",
    ]
    if any(is_stale(o, PROTO) for o in outputs):
        plugin = shutil.which("grpc_cpp_plugin")
        protoc = shutil.which("protoc")
        if not plugin or not protoc:
            sys.exit(
                "protoc and grpc_cpp_plugin are needed: apt-get install protobuf-compiler protobuf-compiler-grpc"
            )
        subprocess.check_call(
            [
                protoc,
                f"-I{PROTO.parent}",
                f"--cpp_out={GENERATED}",
                f"--grpc_out={GENERATED}",
                f"--plugin=protoc-gen-grpc={plugin}",
                str(PROTO),
            ]
        )
    return outputs


def generate_python() -> None:
    """Python stubs, for tools and tests that speak the wire protocol from Python."""
    PY_PROTO.mkdir(parents=True, exist_ok=True)
    grpc_module = PY_PROTO / "torch_grpc_pg_pb2_grpc.py"
    if not is_stale(grpc_module, PROTO):
        return
    subprocess.check_call(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO.parent}",
            f"--python_out={PY_PROTO}",
            f"--grpc_python_out={PY_PROTO}",
            str(PROTO),
        ]
    )
    # grpc_tools writes an absolute import; the stubs live inside our package.
    text = grpc_module.read_text()
    grpc_module.write_text(
        text.replace(
            "import torch_grpc_pg_pb2 as", "from . import torch_grpc_pg_pb2 as"
        )
    )
    (PY_PROTO / "__init__.py").write_text(
        '"""Generated from protos/torch_grpc_pg.proto at build time."""\n'
    )


def torch_free_sources() -> list[Path]:
    """Every folder of csrc/ but backend/ holds no torch header (tests/torch_compat/check.sh reads it so too)."""
    return sorted(
        source for source in CSRC.glob("*/*.cc") if source.parent.name != "backend"
    )


class BuildWithTransport(BuildExtension):
    """Compiles the torch-free sources with the system's headers first, then the rest."""

    def build_extensions(self) -> None:
        # A fixed place, so that editable installs rebuild only what changed.
        self.build_temp = str(ROOT / "build" / "temp")
        sources = torch_free_sources() + generate_cpp()
        headers = list(CSRC.rglob("*.h")) + list(GENERATED.glob("*.h"))
        newest_header = max(h.stat().st_mtime for h in headers)
        obj_dir = Path(self.build_temp).resolve() / "torch_free"
        objects = []
        for src in sources:
            obj = obj_dir / (src.relative_to(ROOT).as_posix().replace("/", "_") + ".o")
            objects.append(str(obj))
            if obj.exists() and obj.stat().st_mtime > max(
                src.stat().st_mtime, newest_header
            ):
                continue
            obj.parent.mkdir(parents=True, exist_ok=True)
            cmd = [
                os.environ.get("CXX", "c++"),
                *TORCH_FREE_FLAGS,
                f"-I{GENERATED}",
                f"-I{CSRC}",
                *pkg_config("--cflags"),
                "-c",
                str(src),
                "-o",
                str(obj),
            ]
            print(" ".join(cmd), flush=True)
            subprocess.check_call(cmd)
        for ext in self.extensions:
            ext.extra_objects = objects + list(ext.extra_objects or [])
        super().build_extensions()


# Before setup(): every command, metadata included, must see the generated
# package, so that wheels and sdists ship the stubs as editable installs do.
generate_python()

extension = CppExtension(
    name="torch_grpc_pg._C",
    sources=[str(p.relative_to(ROOT)) for p in sorted((CSRC / "backend").glob("*.cc"))],
    include_dirs=[str(CSRC)],
    extra_compile_args=GLUE_FLAGS,
    extra_link_args=[*pkg_config("--libs"), "-lgrpc++_reflection"],
)

setup(
    name="torch-grpc-pg",
    version="0.1.0",
    description='A torch.distributed process-group backend ("grpc") that runs collectives over gRPC',
    long_description=(ROOT / "README.md").read_text()
    if (ROOT / "README.md").exists()
    else "",
    long_description_content_type="text/markdown",
    # Listed, not found: torch_grpc_pg._proto is generated above.
    packages=["torch_grpc_pg", "torch_grpc_pg._proto"],
    python_requires=">=3.9",
    # What the installed package imports; grpcio-tools and pybind11 are needed
    # only to build (requirements-dev.txt).
    install_requires=[
        # The releases tests/torch_compat/check.sh builds against: 2.6 and older
        # use the pre-C++11 string ABI (see torch_cxx11_abi), newer are untried.
        "torch>=2.7,<2.16",
        "grpcio",
        "protobuf",
        "numpy",
    ],
    # torch_grpc_pg.torchft and the fault-tolerant demo; 0.2.0 is the release tested.
    extras_require={"torchft": ["torchft>=0.2.0"]},
    ext_modules=[extension],
    cmdclass={"build_ext": BuildWithTransport.with_options(use_ninja=True)},
)
