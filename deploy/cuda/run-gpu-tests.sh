#!/bin/bash
# Runs the CUDA-enabled pipewise-worker test binaries, the kernels' tests on the host CPU, the
# step and stage_passes benches and the PyTorch comparison (bench/compare.py) on the GPU.
set -u
exec > >(tee "$OUT/log.txt") 2>&1
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
nvcc --version | tail -2; uname -r; ldd --version | head -1
mkdir -p /tmp/cb
BIN_DIR=$(cd "${BIN_DIR:-.cudabin}" && pwd)
if command -v xz >/dev/null; then tar xJf "$BIN_DIR/bins.tar.xz" -C /tmp/cb; else python3 -c "import tarfile;tarfile.open('$BIN_DIR/bins.tar.xz').extractall('/tmp/cb')"; fi
ls -la /tmp/cb; el
. "$(dirname "$0")/libs.sh"
ldd /tmp/cb/exactness | grep -E "cu|nvrtc|not found"; el
cd /tmp/cb
# Most telling first: the run may be cut short by the lease.
# The kernels' unit tests on this machine's CPU: its AVX-512 paths, where it has them
# (the development machines have AVX2 only).
echo "===== kernels on this CPU"; el
grep -o -m1 'avx512f' /proc/cpuinfo | head -1; grep -m1 'model name' /proc/cpuinfo
timeout 60 ./pipewise_worker kernels; echo "rc=$?"
echo "===== exactness cuda"; el
timeout 90 ./exactness --test-threads=1 cuda --nocapture; echo "rc=$?"
echo "===== step bench cuda"; el
PIPEWISE_BENCH_DEVICE=cuda PIPEWISE_BENCH_THREADS=1 timeout 90 ./step --bench; echo "rc=$?"
echo "===== compare with PyTorch on the GPU"; el
if [ -f "$BIN_DIR/compare.py" ]; then
  timeout 120 python3 "$BIN_DIR/compare.py" --device cuda --pipewise /tmp/cb/pipewise; echo "rc=$?"
fi
for t in memory checkpoint training; do
  echo "===== $t cuda"; el
  timeout 60 ./$t --test-threads=1 cuda --nocapture; echo "rc=$?"
done
echo "===== step bench cpu (small model)"; el
PIPEWISE_BENCH_MODELS=small timeout 90 ./step --bench; echo "rc=$?"
echo "===== stage_passes cuda"; el
PIPEWISE_BENCH_DEVICE=cuda timeout 45 ./stage_passes --bench; echo "rc=$?"
el; echo DONE
