#!/bin/sh
# Builds llama.cpp for this machine's CPU (-march=native: AVX-512 and AMX where the CPU has them) from PyPI's
# llama-cpp-python source package (its vendored llama.cpp), for `bench/bench_cpu_grading.py --llama-cpp-native DIR`.
# Bench only: never run by `make test` or `make run`. Everything lands in DIR, outside the repository and the venv:
#   DIR/llama_cpp_python-VERSION.tar.gz  the sdist (sha256 checked)
#   DIR/build                            the CMake build (configure.log, build.log)
#   DIR/llama_cpp/                       the sdist's low-level ctypes module alone, the built libraries in lib/
#   bench/build_llama_cpp_native.sh DIR [JOBS]   # JOBS defaults to 2; the build runs under nice -n 19
# Run again, it reuses what is there (an interrupted build goes on where it stopped).
set -eu
dir=${1:?usage: bench/build_llama_cpp_native.sh DIR [JOBS]}
jobs=${2:-2}
version=0.3.16  # vendors llama.cpp 4227c9b (2025-08-14)
sha256=34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6
python=${PYTHON:-python3}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
sdist="$dir/llama_cpp_python-$version.tar.gz"
src="$dir/llama_cpp_python-$version"
[ -f "$sdist" ] || "$python" -m pip download --no-binary :all: --no-deps -d "$dir" "llama-cpp-python==$version"
echo "$sha256  $sdist" | sha256sum -c -
[ -d "$src" ] || tar -xzf "$sdist" -C "$dir"
# $ORIGIN: the libraries find each other once copied into llama_cpp/lib.
nice -n 19 cmake -S "$src/vendor/llama.cpp" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_NATIVE=ON -DCMAKE_BUILD_RPATH='$ORIGIN' -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF >"$dir/configure.log" 2>&1 \
  || { tail -20 "$dir/configure.log"; exit 1; }
grep -E 'CPU backend variant|ggml commit' "$dir/configure.log"
nice -n 19 cmake --build "$dir/build" --target llama -j "$jobs" >"$dir/build.log" 2>&1 \
  || { tail -20 "$dir/build.log"; exit 1; }
mkdir -p "$dir/llama_cpp/lib"
cp -a "$dir/build/bin/"lib*.so* "$dir/llama_cpp/lib/"
cp "$src/llama_cpp/llama_cpp.py" "$src/llama_cpp/_ctypes_extensions.py" "$dir/llama_cpp/"
: >"$dir/llama_cpp/__init__.py"  # the low-level module alone: the package's own __init__ imports its wrapper
echo "instruction sets g++ enables for -march=native here:"
g++ -march=native -dM -E -x c++ /dev/null \
  | sed -n 's/^#define __\(AVX[A-Z0-9_]*\|AMX_[A-Z0-9]*\|FMA\|F16C\)__ 1$/\1/p' | sort | tr '\n' ' '
echo
PYTHONPATH="$dir" "$python" -c 'from llama_cpp import llama_cpp as l; print(l.llama_print_system_info().decode())'
