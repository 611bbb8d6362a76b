#!/bin/bash
# Runs the CUDA-enabled pipewise-worker test binaries and the stage_passes bench on the GPU.
set -u
exec > >(tee "$OUT/log.txt") 2>&1
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
nvcc --version | tail -2; uname -r; ldd --version | head -1
mkdir -p /tmp/cb
BIN_DIR=${BIN_DIR:-.cudabin}
if command -v xz >/dev/null; then tar xJf "$BIN_DIR/bins.tar.xz" -C /tmp/cb; else python3 -c "import tarfile;tarfile.open('$BIN_DIR/bins.tar.xz').extractall('/tmp/cb')"; fi
ls -la /tmp/cb; el
DIRS=""
for lib in libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13; do
  p=$(ldconfig -p | awk -v l="$lib" '$1==l {print $NF; exit}')
  [ -z "$p" ] && p=$(find /usr/local/cuda* /opt /usr/lib /usr/local/lib /usr/local/nvidia -name "$lib" 2>/dev/null | head -1)
  echo "$lib -> ${p:-MISSING}"
  [ -n "$p" ] && DIRS="$DIRS:$(dirname "$p")"
done
export LD_LIBRARY_PATH="${DIRS#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
ldd /tmp/cb/exactness | grep -E "cu|nvrtc|not found"; el
cd /tmp/cb
for t in exactness memory checkpoint training; do
  echo "===== $t cuda"; el
  timeout 150 ./$t --test-threads=1 cuda --nocapture; echo "rc=$?"
done
echo "===== bench cuda"; el
PIPEWISE_BENCH_DEVICE=cuda timeout 150 ./stage_passes --bench; echo "rc=$?"
echo "===== bench cpu"; el
timeout 150 ./stage_passes --bench; echo "rc=$?"
el
for t in exactness memory checkpoint training; do
  [ $(( $(date +%s) - T0 )) -gt 480 ] && { echo "skip $t cpu (time)"; continue; }
  echo "===== $t cpu"; el
  timeout 60 ./$t cpu --nocapture; echo "rc=$?"
done
el; echo DONE
