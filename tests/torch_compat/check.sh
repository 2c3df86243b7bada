#!/usr/bin/env bash
# Checks the extension against one torch release from the package registry.
#
#   tests/torch_compat/check.sh VERSION           compile and link every C++ source
#   tests/torch_compat/check.sh VERSION full      install, build, import, run a smoke subset
#
# "compile" needs one wheel and no install: PyPI's Linux wheels are CUDA builds
# whose dependencies weigh about 3 GB, while the wheel alone is 0.5-0.9 GB and
# downloads in seconds. It reads the release's C++ ABI and standard from its
# own files, compiles csrc/ against its headers as setup.py would, links the
# objects against its CPU libraries and the system's gRPC, and fails on any
# symbol that nothing provides: the way a std::string ABI mismatch shows.
#
# "full" installs the release with its dependencies (about 5 GB) into a venv,
# builds the package with setup.py, and runs tests/torch_compat/smoke.py:
# world-2 collectives compared with gloo. The CUDA wheels import on a machine
# without a GPU, but only with their nvidia-* packages installed.
#
# Work goes to $TORCH_COMPAT_DIR/VERSION (default /tmp/torch-compat). The
# extracted headers and CPU libraries (about 0.5 GB) stay, so that a rerun
# downloads nothing; the wheel and the venv are deleted after a pass unless
# TORCH_COMPAT_KEEP=1, and kept after a failure, to look into.
# MAX_JOBS (default 1) bounds parallel compiles in "full".
set -euo pipefail

usage() {
	echo "usage: $0 VERSION [compile|full]" >&2
	exit 2
}
[ $# -ge 1 ] && [ $# -le 2 ] || usage
VERSION=$1
MODE=${2:-compile}
case $MODE in compile | full) ;; *) usage ;; esac

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${TORCH_COMPAT_DIR:-/tmp/torch-compat}/$VERSION
PYTHON=${PYTHON:-python3}
CXX=${CXX:-c++}
# The release is pinned below; a machine-wide pip constraints file that caps
# torch must not turn an explicit request into a resolution error.
export PIP_CONSTRAINT=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1

log() { echo "== torch $VERSION: $*" >&2; }
keep() { [ "${TORCH_COMPAT_KEEP:-0}" = 1 ]; }

# The working tree as git sees it (tracked and untracked, less what is
# ignored), so that uncommitted edits are what gets checked.
copy_tree() {
	rm -rf "$1" && mkdir -p "$1"
	git -C "$ROOT" ls-files -co --exclude-standard -z | tar -C "$ROOT" --null -T - -cf - | tar -C "$1" -xf -
}

check_compile() {
	local wheel_dir=$WORK/wheel torch=$WORK/torch obj=$WORK/obj
	mkdir -p "$wheel_dir" "$obj"
	if [ ! -f "$torch/share/cmake/Torch/TorchConfig.cmake" ]; then
		log "downloading the wheel (no dependencies)"
		"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --no-cache-dir -d "$wheel_dir" "torch==$VERSION"
		local wheel
		wheel=$(ls "$wheel_dir"/torch-*.whl)
		rm -rf "$torch"
		# Headers, the files that say how to build against them, and the CPU
		# libraries the extension links with (never the CUDA ones, which are most of the wheel).
		unzip -q -o "$wheel" 'torch/include/*' torch/share/cmake/Torch/TorchConfig.cmake \
			torch/utils/cpp_extension.py 'torch/lib/libc10.so' 'torch/lib/libtorch_cpu.so' \
			'torch/lib/libtorch_python.so' 'torch/lib/libgomp*' -d "$WORK"
		keep || rm -rf "$wheel_dir"
	fi

	# Releases built with the pre-C++11 std::string ABI say so in TorchConfig.cmake;
	# newer ones drop the line, the compiler's default (1) being theirs.
	local abi=1 std
	grep -q '_GLIBCXX_USE_CXX11_ABI=0' "$torch/share/cmake/Torch/TorchConfig.cmake" && abi=0
	std=$(grep -o "common_cflags += \['-std=c++[0-9]*'" "$torch/utils/cpp_extension.py" | grep -o 'c++[0-9]*' | head -1)
	log "C++ ABI $abi, -std=$std"

	# The torch-free half depends on torch only through the ABI: one set of
	# objects per ABI and per content of the sources serves every release.
	# A hash, not file times: a checkout or a stash can leave an object newer
	# than a source it no longer matches.
	local sources_hash
	sources_hash=$(cat "$ROOT"/csrc/*/*.h "$ROOT"/csrc/*/*.cc "$ROOT/protos/torch_grpc_pg.proto" | sha256sum | cut -c1-16)
	local shared=$WORK/../torch-free-abi$abi-$sources_hash
	local gen=$shared/generated
	mkdir -p "$gen"
	if [ ! -e "$gen/torch_grpc_pg.pb.cc" ]; then
		protoc -I"$ROOT/protos" --cpp_out="$gen" --grpc_out="$gen" \
			--plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" "$ROOT/protos/torch_grpc_pg.proto"
	fi

	local py_include common src o objects=()
	py_include=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
	# -O0: the check is about what compiles and links, not about speed.
	common=(-O0 -fPIC -Wall -Wno-unused-parameter "-D_GLIBCXX_USE_CXX11_ABI=$abi" "-I$ROOT/csrc")
	# setup.py's two halves: torch-free sources against the system's gRPC and
	# protobuf only, then the glue against torch with torch's standard.
	# Every folder of csrc/ but backend/ is torch-free, as setup.py reads it.
	local torch_free=()
	for src in "$ROOT"/csrc/*/*.cc; do
		case $src in "$ROOT"/csrc/backend/*) ;; *) torch_free+=("$src") ;; esac
	done
	for src in "${torch_free[@]}" "$gen"/*.pb.cc; do
		o=$shared/$(basename "$src").o
		objects+=("$o")
		if [ -e "$o" ]; then continue; fi
		log "compile ${src#"$ROOT"/}"
		# shellcheck disable=SC2046  # pkg-config prints several flags
		"$CXX" -std=c++17 "${common[@]}" "-I$gen" $(pkg-config --cflags grpc++ protobuf libcrypto) -c "$src" -o "$o.partial" && mv "$o.partial" "$o"
	done
	for src in "$ROOT"/csrc/backend/*.cc; do
		o=$obj/backend_$(basename "$src").o
		objects+=("$o")
		log "compile ${src#"$ROOT"/}"
		"$CXX" "-std=$std" "${common[@]}" -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_C \
			-isystem "$torch/include" -isystem "$torch/include/torch/csrc/api/include" \
			-isystem "$py_include" -c "$src" -o "$o"
	done

	local so=$WORK/_C.so
	log "link"
	# shellcheck disable=SC2046
	"$CXX" -shared "${objects[@]}" -o "$so" -L"$torch/lib" -lc10 -ltorch_cpu -ltorch_python \
		$(pkg-config --libs grpc++ protobuf libcrypto) -lgrpc++_reflection
	# A shared object may link with undefined symbols; resolve them now, as an
	# import would. Python's own come from the interpreter at import time.
	local missing
	missing=$(LD_LIBRARY_PATH=$torch/lib ldd -r "$so" 2>&1 | grep "undefined symbol" | grep -F "($so)" |
		grep -v -E 'undefined symbol: _?Py' || true)
	if [ -n "$missing" ]; then
		echo "$missing" | sed 's/\t.*//' | c++filt | head -20 >&2
		log "FAILED: $(echo "$missing" | wc -l) symbols the extension needs are in no library it loads"
		if [ "$abi" = 0 ]; then
			echo "This release uses the pre-C++11 std::string ABI; the system's gRPC and protobuf use the C++11 one." >&2
		fi
		return 1
	fi
	log "compiles and links"
}

check_full() {
	local venv=$WORK/venv src=$WORK/src
	if [ ! -x "$venv/bin/python" ]; then
		log "installing into $venv"
		"$PYTHON" -m venv "$venv"
		# requirements-dev.txt less its own torch pin.
		"$venv/bin/python" -m pip install -q --no-cache-dir "torch==$VERSION" \
			-r <(grep -v -E '^torch([^a-z_-]|$)' "$ROOT/requirements-dev.txt")
	fi
	"$venv/bin/python" -c 'import torch; print("torch", torch.__version__, "C++11 ABI:", getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))'

	copy_tree "$src"
	# The torch-free objects do not depend on torch: reuse the repository's own
	# build when there is one (setup.py rebuilds what is older than its sources).
	if [ -d "$ROOT/build/temp/torch_free" ]; then
		mkdir -p "$src/build/temp"
		cp -a "$ROOT/build/generated" "$src/build/"
		cp -a "$ROOT/build/temp/torch_free" "$src/build/temp/"
	fi
	log "building"
	(cd "$src" && MAX_JOBS=${MAX_JOBS:-1} "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e .)
	log "smoke subset"
	(cd "$src" && "$venv/bin/python" -m pytest -q tests/torch_compat/smoke.py)
	keep || rm -rf "$venv" "$src"
	log "builds, imports and passes the smoke subset"
}

mkdir -p "$WORK"
"check_$MODE"
