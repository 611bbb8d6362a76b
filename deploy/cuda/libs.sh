# Sourced: puts the folders of the CUDA 13 libraries that the `cuda` builds need to start on
# LD_LIBRARY_PATH (the GPU machines keep them in the driver's and PyTorch's folders). The
# search (a minute's `find` at worst) runs once a machine: later callers read its result.
CUDA_LIBS_FOUND=/tmp/pipewise-cuda-libs.path
if [ -s "$CUDA_LIBS_FOUND" ]; then
  DIRS=$(cat "$CUDA_LIBS_FOUND")
else
  DIRS=""
  for lib in libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13; do
    p=$(ldconfig -p | awk -v l="$lib" '$1==l {print $NF; exit}')
    [ -z "$p" ] && p=$(find /usr/local/cuda* /opt /usr/lib /usr/local/lib /usr/local/nvidia -name "$lib" 2>/dev/null | head -1)
    echo "$lib -> ${p:-MISSING}"
    [ -n "$p" ] && DIRS="$DIRS:$(dirname "$p")"
  done
  echo "$DIRS" > "$CUDA_LIBS_FOUND"
fi
export LD_LIBRARY_PATH="${DIRS#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
